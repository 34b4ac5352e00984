//! Counting calls made inside callers' transactions (`jobs/tx_counts.rs`),
//! on the `sim` store: a node counts the adds committed under its name
//! after it started (not those before: the baseline), once each, not
//! those of an aborted transaction nor another node's, and a watcher
//! restarted after a panic neither loses nor repeats a count.
//!
//! The adds here are made in the test's own transactions, as a caller's
//! transaction makes them (`tx_counts::count`, the two atomic adds); the
//! calls that make them in a caller's FoundationDB transaction are tested
//! live by `test/couch_workers_tx_tests.erl`.

mod jobs_common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use couch_workers_core::jobs::tx_counts::{self, TxEvent};
use couch_workers_core::log::{Event, Sink, Value};
use couch_workers_core::store::sim::{SimOptions, SimStore};
use couch_workers_core::store::{run, Db, StoreError};
use couch_workers_core::tasks::supervise::ServiceKind;
use couch_workers_core::{Node, Settings};
use jobs_common::eventually;

#[derive(Default)]
struct Collect(Mutex<Vec<Event>>);

impl Sink for Collect {
    fn log(&self, event: Event) {
        self.0.lock().unwrap().push(event);
    }
}

impl Collect {
    /// The sums of the `tx_calls_counted` events, by (type, event), and
    /// how many events.
    fn counted(&self) -> (HashMap<(Vec<u8>, String), i64>, usize) {
        let mut sums = HashMap::new();
        let mut n = 0;
        for e in self.0.lock().unwrap().iter().filter(|e| e.what == "tx_calls_counted") {
            let field = |k: &str| e.fields.iter().find(|(name, _)| *name == k).map(|(_, v)| v.clone());
            let (Some(Value::Bytes(t)), Some(Value::Str(ev)), Some(Value::Int(c))) =
                (field("type"), field("event"), field("count"))
            else {
                panic!("a tx_calls_counted event of another shape: {e:?}");
            };
            *sums.entry((t, ev)).or_insert(0) += c;
            n += 1;
        }
        (sums, n)
    }

    fn count_of(&self, t: &[u8], ev: &str) -> i64 {
        self.counted().0.get(&(t.to_vec(), ev.to_string())).copied().unwrap_or(0)
    }

    fn restarts(&self) -> usize {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter(|e| e.what == "service_restarted")
            .filter(|e| e.fields.iter().any(|(k, v)| *k == "service" && *v == Value::Str("tx_counts_watcher".into())))
            .count()
    }
}

/// Commits `adds` counts under `name` in one transaction (or, with
/// `abort`, makes them and fails the transaction).
async fn commit(node: &Node, name: &[u8], adds: &[(&[u8], TxEvent)], abort: bool) {
    let ks = node.keyspace();
    let outcome = run(node.db().as_ref(), node.write_options(), |tx| async move {
        for (t, ev) in adds {
            tx_counts::count(tx.as_ref(), ks, name, t, *ev);
        }
        if abort {
            return Err(StoreError::Invalid("the caller's fun threw".into()));
        }
        Ok(())
    })
    .await;
    assert_eq!(outcome.is_ok(), !abort, "{outcome:?}");
}

/// Waits until the marker type `m` was counted once: every count
/// committed before it was reported by then (the watcher reads all of a
/// node's counters at one version).
async fn settle(node: &Node, log: &Collect, name: &[u8], m: &[u8]) {
    commit(node, name, &[(m, TxEvent::Added)], false).await;
    let seen = eventually(Duration::from_secs(10), || async { log.count_of(m, "added") >= 1 }).await;
    assert!(seen, "the marker {m:?} was reported");
    assert_eq!(log.count_of(m, "added"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn committed_counts_are_reported_once_after_the_baseline() {
    let sim = SimStore::new(SimOptions::new(77));
    let db: Db = sim.clone();
    let log = Arc::new(Collect::default());
    let node = Node::with_db(db, Settings::default(), log.clone());
    let name: &[u8] = b"cw@host1";
    // Before the node counts: the baseline, not this run's.
    commit(&node, name, &[(b"a", TxEvent::Added), (b"a", TxEvent::Added)], false).await;
    node.count_tx_calls(name).await;
    commit(&node, name, &[(b"a", TxEvent::Added), (b"a", TxEvent::Finished)], false).await;
    commit(&node, name, &[(b"a", TxEvent::Added), (b"b", TxEvent::Removed)], true).await;
    commit(&node, b"cw@host2", &[(b"a", TxEvent::Added)], false).await;
    commit(&node, name, &[(b"b", TxEvent::Canceled), (b"b", TxEvent::Resubmitted)], false).await;
    settle(&node, &log, name, b"marker1").await;
    let (sums, _) = log.counted();
    let expect: HashMap<(Vec<u8>, String), i64> = [
        ((b"a".to_vec(), "added".to_string()), 1),
        ((b"a".to_vec(), "finished".to_string()), 1),
        ((b"b".to_vec(), "canceled".to_string()), 1),
        ((b"b".to_vec(), "resubmitted".to_string()), 1),
        ((b"marker1".to_vec(), "added".to_string()), 1),
    ]
    .into_iter()
    .collect();
    assert_eq!(sums, expect);

    // A restarted watcher keeps what it had read: no count lost, none
    // repeated.
    node.inject_panic(ServiceKind::TxCounts, 1);
    let restarted = eventually(Duration::from_secs(10), || async { log.restarts() >= 1 }).await;
    assert!(restarted, "the watcher was restarted");
    commit(&node, name, &[(b"a", TxEvent::Added)], false).await;
    settle(&node, &log, name, b"marker2").await;
    assert_eq!(log.count_of(b"a", "added"), 2);
    assert_eq!(log.count_of(b"a", "finished"), 1);
    assert_eq!(log.count_of(b"marker1", "added"), 1);
    node.stop().await;
}
