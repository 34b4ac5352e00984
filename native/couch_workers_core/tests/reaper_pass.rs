//! I1, an idle node: what one reaper pass costs. A pass is its
//! writable look and a scan; with a few workers the scan is one read
//! transaction (it finds the next worker type itself), and a pass on the
//! liveness cadence's timer keeps the `health_vs` watch of an earlier
//! pass instead of arming a new one. Counted with a `tracing` layer: the
//! `transaction` spans inside each `reaper_pass` span, and the passes'
//! `armed` field. One test per binary (a process-wide subscriber).

mod jobs_common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use jobs_common::*;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

#[derive(Default)]
struct Counts {
    passes: AtomicU64,
    armed: AtomicU64,
    transactions_in_passes: AtomicU64,
}

struct CountPasses(Arc<Counts>);

struct Armed(bool);

impl Visit for Armed {
    fn record_bool(&mut self, field: &Field, value: bool) {
        if field.name() == "armed" {
            self.0 = value;
        }
    }
    fn record_debug(&mut self, _field: &Field, _value: &dyn std::fmt::Debug) {}
}

impl<S> Layer<S> for CountPasses
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, _id: &Id, ctx: Context<'_, S>) {
        match attrs.metadata().name() {
            "reaper_pass" => {
                self.0.passes.fetch_add(1, Ordering::SeqCst);
                let mut armed = Armed(false);
                attrs.record(&mut armed);
                if armed.0 {
                    self.0.armed.fetch_add(1, Ordering::SeqCst);
                }
            }
            "transaction" => {
                let parent =
                    if attrs.is_contextual() { ctx.lookup_current() } else { attrs.parent().and_then(|p| ctx.span(p)) };
                if parent.is_some_and(|p| p.scope().any(|s| s.name() == "reaper_pass")) {
                    self.0.transactions_in_passes.fetch_add(1, Ordering::SeqCst);
                }
            }
            _ => {}
        }
    }
}

fn snapshot(c: &Counts) -> (u64, u64, u64) {
    (c.passes.load(Ordering::SeqCst), c.armed.load(Ordering::SeqCst), c.transactions_in_passes.load(Ordering::SeqCst))
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_reaper_pass_is_two_transactions_and_keeps_its_watch() {
    let counts = Arc::new(Counts::default());
    let subscriber = tracing_subscriber::registry().with(CountPasses(counts.clone()));
    tracing::subscriber::set_global_default(subscriber).expect("the first subscriber");
    let c = Cluster::new();
    let node = c.node();
    // Two worker types (the scan steps from one to the next), timeout
    // 15 s: a heartbeat every ~5 s, a liveness cadence of 3-3.75 s.
    let a = register(&node, b"idle-a", b"w").await;
    let b = register(&node, b"idle-b", b"w").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (p0, a0, t0) = snapshot(&counts);
    tokio::time::sleep(Duration::from_secs(9)).await;
    let (p1, a1, t1) = snapshot(&counts);
    let (passes, armed, transactions) = (p1 - p0, a1 - a0, t1 - t0);
    eprintln!("in 9 s: {passes} reaper passes, {armed} of them armed a watch, {transactions} transactions in them");
    // Each ~5 s heartbeat period has a pass after the heartbeat's change
    // and one on the cadence's timer before the next heartbeat: in 9 s at
    // least one of each kind, whatever the load.
    assert!(passes >= 2, "{passes} reaper passes in 9 s");
    // Before: every pass armed a new watch.
    assert!(armed < passes, "every one of {passes} passes armed a new watch");
    // Before: the writable look, then per type a look for the type and
    // one for its records, and a last look that found no further type: 6.
    assert!(transactions <= 2 * passes, "{transactions} transactions in {passes} reaper passes");
    drop((a, b));
    node.stop().await;
}
