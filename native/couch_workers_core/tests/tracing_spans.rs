//! The `tracing` spans of log.rs, seen by a subscriber of the test's own:
//! a transaction with its attempts, outcome and duration; a heartbeat, a
//! reap and an accept round, each around the transactions it runs.
//!
//! Each test sets its subscriber for its thread only, on a current-thread
//! runtime, so every task of its node (spawned on that runtime) reports to
//! it and no other test's does.

mod jobs_common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use couch_workers_core::roster;
use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::{run, StoreError, TxOptions};
use couch_workers_core::workers::{self, WorkerSpec};
use jobs_common::*;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// A span as it closed: its name, its parent's name, its fields.
#[derive(Debug, Clone, Default)]
struct Closed {
    name: &'static str,
    parent: Option<&'static str>,
    fields: HashMap<&'static str, String>,
}

#[derive(Clone, Default)]
struct Capture {
    open: Arc<Mutex<HashMap<Id, Closed>>>,
    closed: Arc<Mutex<Vec<Closed>>>,
}

struct Fields<'a>(&'a mut HashMap<&'static str, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name(), value.to_string());
    }
    fn record_bytes(&mut self, field: &Field, value: &[u8]) {
        self.0.insert(field.name(), String::from_utf8_lossy(value).into_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let parent = ctx.span(id).and_then(|s| s.parent()).map(|p| p.name());
        let mut span = Closed { name: attrs.metadata().name(), parent, fields: HashMap::new() };
        attrs.record(&mut Fields(&mut span.fields));
        self.open.lock().unwrap().insert(id.clone(), span);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        if let Some(span) = self.open.lock().unwrap().get_mut(id) {
            values.record(&mut Fields(&mut span.fields));
        }
    }

    fn on_close(&self, id: Id, _ctx: Context<'_, S>) {
        if let Some(span) = self.open.lock().unwrap().remove(&id) {
            self.closed.lock().unwrap().push(span);
        }
    }
}

impl Capture {
    fn closed(&self, name: &str) -> Vec<Closed> {
        self.closed.lock().unwrap().iter().filter(|s| s.name == name).cloned().collect()
    }
}

#[tokio::test]
async fn a_transaction_span_holds_its_attempts_outcome_and_duration() {
    let capture = Capture::default();
    let _default = tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open store");

    // A conflict on the first attempt, a commit on the second.
    let mut attempt = 0;
    run(store.as_ref(), TxOptions::write(), |tx| {
        attempt += 1;
        let first = attempt == 1;
        async move {
            tx.set(b"k", b"v");
            if first {
                return Err(StoreError::Conflict);
            }
            Ok(())
        }
    })
    .await
    .expect("committed on the second attempt");
    // Not retryable: one attempt, and its error names the outcome.
    let refused =
        run(store.as_ref(), TxOptions::read(), |_tx| async { Err::<(), _>(StoreError::Invalid("test".into())) }).await;
    assert!(matches!(refused, Err(StoreError::Invalid(_))));

    let spans = capture.closed("transaction");
    assert_eq!(spans.len(), 2, "one span per run: {spans:?}");
    let (retried, failed) = (&spans[0].fields, &spans[1].fields);
    assert_eq!(retried.get("attempts").map(String::as_str), Some("2"), "{retried:?}");
    assert_eq!(retried.get("outcome").map(String::as_str), Some("committed"));
    assert_eq!(retried.get("writes").map(String::as_str), Some("true"));
    assert!(retried.get("duration_us").is_some_and(|d| d.parse::<u64>().is_ok()), "{retried:?}");
    assert_eq!(failed.get("attempts").map(String::as_str), Some("1"), "{failed:?}");
    assert_eq!(failed.get("outcome").map(String::as_str), Some("invalid"));
    assert_eq!(failed.get("writes").map(String::as_str), Some("false"));
}

#[tokio::test]
async fn heartbeat_reap_and_accept_round_spans_hold_their_transactions() {
    const T: &[u8] = b"spans";
    let capture = Capture::default();
    let _default = tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    let c = Cluster::new();
    let node = c.node();
    // Timeout 1 s: heartbeats about every 333 ms.
    let reg = node.register_worker(WorkerSpec { timeout_s: 1, ..spec(T, b"live") }).await.expect("register");
    add(node.jobs(), T, b"j", 0).await;
    // With a timeout: through the type's dispatcher and its rounds.
    let handle = node.jobs().accept(T, b"live", Duration::from_secs(10)).await.expect("accept");
    // A worker with no heartbeat task (written directly, timeout 1 s): the
    // node's reaper reaps it.
    let silent = WorkerSpec { timeout_s: 1, ..spec(T, b"silent") };
    let (ks, s, inc) = (node.keyspace(), &silent, workers::new_incarnation());
    let inc = &inc;
    run(node.db().as_ref(), TxOptions::write(), |tx| async move { roster::register(&tx, ks, s, inc, 0).await })
        .await
        .expect("register the silent worker");

    // Counted, not timed: the deadline only bounds a broken build.
    let seen = eventually(Duration::from_secs(30), || async {
        !capture.closed("heartbeat").is_empty()
            && capture.closed("reap").iter().any(|s| s.fields.get("id").map(String::as_str) == Some("silent"))
    })
    .await;
    assert!(seen, "a heartbeat and a reap of the silent worker within 30 s");

    let rounds = capture.closed("accept_round");
    assert!(rounds.iter().any(|s| s.fields.get("type").map(String::as_str) == Some("spans")), "{rounds:?}");
    let heartbeat = &capture.closed("heartbeat")[0];
    assert!(heartbeat.fields.get("workers").is_some_and(|n| n.parse::<u64>().is_ok_and(|n| n >= 1)), "{heartbeat:?}");
    let reap =
        capture.closed("reap").into_iter().find(|s| s.fields.get("id").map(String::as_str) == Some("silent")).unwrap();
    assert_eq!(reap.fields.get("type").map(String::as_str), Some("spans"));
    // Each holds the transactions it ran.
    let parents: Vec<_> = capture.closed("transaction").into_iter().filter_map(|s| s.parent).collect();
    for outer in ["heartbeat", "reap", "accept_round"] {
        assert!(parents.contains(&outer), "a transaction inside a {outer} span: {parents:?}");
    }

    node.jobs().finish(&handle.fence(), b"{}").await.expect("finish");
    drop(reg);
    node.stop().await;
}
