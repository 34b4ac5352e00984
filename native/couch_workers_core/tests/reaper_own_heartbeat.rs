//! I1, an idle node: a change of `health_vs` made by the node's own heartbeat
//! is looked at in the wake-up the heartbeat's commit made, without the
//! random delay after other changes (whose sleep cost an idle node two
//! more wake-ups of tokio's timer wheel per heartbeat); and on the
//! embedded store the renewal does not fire the reaper's watch (it spares
//! the handle's own watches; the reaper hears of it in-process), so the
//! reaper keeps the watch it armed instead of arming a new one per
//! heartbeat. Counted with a `tracing` layer (the `reaper_after_change`
//! span, by `own`; the `reaper_pass` span, by `armed`). One test per
//! binary (a process-wide subscriber).

mod jobs_common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use couch_workers_core::workers::WorkerSpec;
use jobs_common::*;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// Changes taken for the node's own (`[1]`) and for others' (`[0]`);
/// passes that armed a new watch (`[2]`).
#[derive(Default, Clone)]
struct Changes(Arc<[AtomicU64; 3]>);

impl Changes {
    fn get(&self) -> (u64, u64) {
        (self.0[1].load(Ordering::SeqCst), self.0[0].load(Ordering::SeqCst))
    }

    fn armed(&self) -> u64 {
        self.0[2].load(Ordering::SeqCst)
    }
}

/// The value of one bool field of a span.
struct Own(&'static str, Option<bool>);

impl Visit for Own {
    fn record_bool(&mut self, field: &Field, value: bool) {
        if field.name() == self.0 {
            self.1 = Some(value);
        }
    }
    fn record_debug(&mut self, _field: &Field, _value: &dyn std::fmt::Debug) {}
}

struct CountChanges(Changes);

impl<S: Subscriber> Layer<S> for CountChanges {
    fn on_new_span(&self, attrs: &Attributes<'_>, _id: &Id, _ctx: Context<'_, S>) {
        if attrs.metadata().name() == "reaper_after_change" {
            let mut own = Own("own", None);
            attrs.record(&mut own);
            if let Some(own) = own.1 {
                self.0 .0[usize::from(own)].fetch_add(1, Ordering::SeqCst);
            }
        }
        if attrs.metadata().name() == "reaper_pass" {
            let mut armed = Own("armed", None);
            attrs.record(&mut armed);
            if armed.1 == Some(true) {
                self.0 .0[2].fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_nodes_own_heartbeat_is_looked_at_without_the_random_delay() {
    let changes = Changes::default();
    let subscriber = tracing_subscriber::registry().with(CountChanges(changes.clone()));
    tracing::subscriber::set_global_default(subscriber).expect("the first subscriber");
    let c = Cluster::new();
    let node = c.node();
    // Timeout 3 s: a heartbeat a second.
    let spec = WorkerSpec { worker_type: b"t".to_vec(), id: b"w".to_vec(), options_json: b"{}".to_vec(), timeout_s: 3 };
    let reg = node.register_worker(spec).await.expect("register");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (own0, other0) = changes.get();
    let (beats0, armed0) = (node.heartbeat_transactions(), changes.armed());
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (own, other) = changes.get();
    let (own, other, beats) = (own - own0, other - other0, node.heartbeat_transactions() - beats0);
    let armed = changes.armed() - armed0;
    eprintln!("in 6 s: {beats} heartbeats; changes taken as the node's own {own}, as others' {other}; passes that armed a watch {armed}");
    assert!(beats >= 4, "a heartbeat a second: {beats} in 6 s");
    // Only this node writes health records: each heartbeat fires the
    // reaper's watch, and is recognised as its own; a heartbeat begun
    // just before a pass armed its watch may be taken for another's.
    assert!(own >= 3, "changes taken as the node's own: {own} of {beats} heartbeats (others' {other})");
    assert!(other <= 2, "changes taken as others': {other} (own {own}, {beats} heartbeats)");
    // The renewals spared the watch: none fired it, so no pass armed a
    // new one (each heartbeat fired it, and the next pass re-armed, when
    // the renewals did not spare it: as many as the heartbeats).
    assert_eq!(armed, 0, "passes that armed a new health_vs watch in 6 s ({beats} heartbeats)");
    drop(reg);
    node.stop().await;
}
