//! I1, an idle node: a waiting acceptor costs nothing while it waits. The
//! dispatcher of a type with one waiter and no job sleeps on its watch
//! and its waiter's deadline: it no longer wakes every second to ask
//! whether the waiter still waits, since the waiter's reply rings it when
//! the acceptor goes (`AcceptReply::signal_gone`). Counted with a
//! `tracing` layer (the `dispatcher_wake` span, by `why`). One test per
//! binary (a process-wide subscriber).

mod jobs_common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jobs_common::*;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

#[derive(Default, Clone)]
struct Wakes(Arc<Mutex<BTreeMap<String, u64>>>);

impl Wakes {
    fn snapshot(&self) -> BTreeMap<String, u64> {
        self.0.lock().unwrap().clone()
    }
}

struct Why(String);

impl Visit for Why {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "why" {
            self.0 = value.to_string();
        }
    }
    fn record_debug(&mut self, _field: &Field, _value: &dyn std::fmt::Debug) {}
}

struct CountWakes(Wakes);

impl<S: Subscriber> Layer<S> for CountWakes {
    fn on_new_span(&self, attrs: &Attributes<'_>, _id: &Id, _ctx: Context<'_, S>) {
        if attrs.metadata().name() == "dispatcher_wake" {
            let mut why = Why(String::new());
            attrs.record(&mut why);
            *self.0 .0.lock().unwrap().entry(why.0).or_default() += 1;
        }
    }
}

fn total(w: &BTreeMap<String, u64>) -> u64 {
    w.values().sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_waiting_acceptor_wakes_its_dispatcher_only_when_it_goes() {
    let wakes = Wakes::default();
    let subscriber = tracing_subscriber::registry().with(CountWakes(wakes.clone()));
    tracing::subscriber::set_global_default(subscriber).expect("the first subscriber");
    let c = Cluster::new();
    let node = c.node();
    let _w = register(&node, b"t", b"w").await;
    let jobs = node.jobs().clone();
    let waiter = tokio::spawn(async move { jobs.accept(b"t", b"w", Duration::from_secs(600)).await });
    assert!(eventually(Duration::from_secs(10), || async { node.jobs().stats().waiters == 1 }).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = wakes.snapshot();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let idle = wakes.snapshot();
    let woke = total(&idle) - total(&before);
    eprintln!("an idle dispatcher with one waiter woke {woke} times in 6 s: {idle:?}");
    // Nothing changes the type's `jobs_vs`, and the deadline is 10 min
    // away. Before: once a second ("timer").
    assert!(woke <= 1, "an idle dispatcher woke {woke} times in 6 s: {idle:?}");
    // The acceptor goes: its reply rings, and the dispatcher, left with
    // no waiter, exits (not at the waiter's deadline).
    waiter.abort();
    assert!(eventually(Duration::from_secs(10), || async { node.jobs().stats().dispatchers == 0 }).await);
    assert_eq!(node.jobs().stats().waiters, 0);
    let after = wakes.snapshot();
    assert!(after.get("gone").copied().unwrap_or(0) >= 1, "the dispatcher was not rung: {after:?}");
    node.stop().await;
}
