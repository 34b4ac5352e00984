//! Writes that fail jobs over answer for their own landed commit: a reap,
//! an owner's exit (`worker_died`) and a registration that replaces
//! another, when their commit landed but was answered
//! `commit_unknown_result`, still log what they did (`worker_reaped`,
//! `worker_jobs_requeued`, with the jobs they failed over), which is how a
//! node's metrics count reaps and requeued jobs. Before their receipts,
//! the retry found the worker already gone (its own doing) and logged
//! nothing.
//!
//! On the `sim` store, behind a wrapper that scripts one
//! `UnknownCommitted` fault for the first commit that clears a given
//! worker's health key (`faults_common::unknown_commit`).

mod faults_common;

use std::sync::Arc;
use std::time::Duration;

use couch_workers_core::keyspace::Keyspace;
use couch_workers_core::log::{Event, Value};
use couch_workers_core::roster;
use couch_workers_core::services::owner_events::OwnerEvent;
use couch_workers_core::store::sim::{SimOptions, SimStore};
use couch_workers_core::store::{run, Database, TxOptions};
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Node, Settings};
use faults_common::unknown_commit::UnknownOnWrite;
use faults_common::CaptureLog;

const T: &[u8] = b"t";

struct Setup {
    fault: Arc<UnknownOnWrite>,
    node: Arc<Node>,
    log: Arc<CaptureLog>,
}

/// A node on the wrapped sim store whose fault waits for a clear of
/// worker `id`'s health key.
fn setup(seed: u64, id: &[u8]) -> Setup {
    let sim = SimStore::new(SimOptions::new(seed));
    let key = Keyspace::new(&sim.prefix()).health(T, id);
    setup_with(sim, key, false)
}

/// A node on the wrapped sim store whose fault waits for a write of `key`:
/// its clear, or with `on_set` its set.
fn setup_with(sim: Arc<SimStore>, key: Vec<u8>, on_set: bool) -> Setup {
    let fault = UnknownOnWrite::new(sim, key, on_set);
    let log = CaptureLog::new();
    let settings = Settings { reaper_max_interval: Duration::from_millis(200), ..Settings::default() };
    let node = Node::with_db(fault.db(), settings, log.clone());
    Setup { fault, node, log }
}

impl Setup {
    fn arm(&self) -> u64 {
        self.fault.arm()
    }

    /// The fault was used, by the write under test.
    fn fired(&self, before: u64) {
        self.fault.fired(before)
    }

    async fn add_running(&self, worker: &[u8], ids: &[&str]) {
        let jobs = self.node.jobs();
        for id in ids {
            jobs.add(T, id.as_bytes(), b"{}", 0).await.expect("add");
            let h = jobs.accept(T, worker, Duration::ZERO).await.expect("accept");
            assert_eq!(h.job.worker.as_deref(), Some(worker));
        }
    }

    async fn pending(&self) -> u64 {
        self.node.jobs().pending_count(T).await.expect("pending count")
    }
}

fn int(event: &Event, key: &str) -> Option<i64> {
    event.fields.iter().find_map(|(k, v)| match v {
        Value::Int(i) if *k == key => Some(*i),
        _ => None,
    })
}

fn spec(id: &[u8], timeout_s: u64) -> WorkerSpec {
    WorkerSpec { worker_type: T.to_vec(), id: id.to_vec(), options_json: b"{}".to_vec(), timeout_s }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_landed_unknown_reap_logs_worker_reaped() {
    let s = setup(11, b"silent");
    // Registered without a heartbeat task (timeout 1 s): this node's
    // reaper reaps it.
    let ks = s.node.keyspace().clone();
    let (k, sp) = (&ks, &spec(b"silent", 1));
    run(s.node.db().as_ref(), TxOptions::write(), |tx| async move { roster::register(&tx, k, sp, &[7; 16], 0).await })
        .await
        .expect("register");
    s.add_running(b"silent", &["j1", "j2"]).await;
    let before = s.arm();
    let reaped = s.log.wait_for("worker_reaped", 1, Duration::from_secs(20)).await.expect("worker_reaped logged");
    s.fired(before);
    assert_eq!(int(&reaped, "jobs"), Some(2), "the jobs its landed commit failed over: {reaped:?}");
    assert_eq!(s.pending().await, 2);
    // Logged once: the retry answered from the receipt.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(s.log.count("worker_reaped"), 1);
    s.node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_landed_unknown_owner_exit_logs_its_requeued_jobs() {
    let s = setup(12, b"w1");
    let reg = s.node.register_worker(spec(b"w1", 3600)).await.expect("register");
    s.add_running(b"w1", &["j1", "j2", "j3"]).await;
    let before = s.arm();
    s.node.worker_died(&reg).await.expect("worker_died");
    s.fired(before);
    let events = s.log.named("worker_jobs_requeued");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(int(&events[0], "jobs"), Some(3));
    assert_eq!(s.pending().await, 3);
    s.node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacing_registration_logs_the_jobs_it_failed_over() {
    let s = setup(13, b"w1");
    // The id's registration of a node that is gone (no heartbeat task).
    let ks = s.node.keyspace().clone();
    let (k, sp) = (&ks, &spec(b"w1", 3600));
    run(s.node.db().as_ref(), TxOptions::write(), |tx| async move { roster::register(&tx, k, sp, &[7; 16], 0).await })
        .await
        .expect("register");
    s.add_running(b"w1", &["j1", "j2"]).await;
    let _reg = s.node.register_worker(spec(b"w1", 3600)).await.expect("register again");
    let events = s.log.named("worker_jobs_requeued");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(int(&events[0], "jobs"), Some(2));
    assert_eq!(s.pending().await, 2);
    s.node.stop().await;
}

/// A worker reaped while its node lives is registered again by its next
/// heartbeat, and its owner is told (`Reaped`). When that heartbeat's
/// commit lands but is answered `commit_unknown_result`, the retry finds
/// the worker registered by its own write: the owner is still told, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_landed_unknown_reinstatement_tells_the_owner_once() {
    let sim = SimStore::new(SimOptions::new(14));
    // The fault waits for the reinstatement's write of the member key.
    let member = Keyspace::new(&sim.prefix()).member(T, b"w1");
    let s = setup_with(sim, member, true);
    // Timeout 1 s: a heartbeat about every 333 ms.
    let reg = s.node.register_worker(spec(b"w1", 1)).await.expect("register");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let tx = std::sync::Mutex::new(tx);
    assert!(!reg.listen(Box::new(move |e| {
        let _ = tx.lock().unwrap().send(e);
    })));
    let before = s.arm();
    // Another node's reaper removes the worker while it lives.
    let ks = s.node.keyspace().clone();
    let health = ks.health(T, b"w1");
    let k = &ks;
    let observed = run(s.node.db().as_ref(), TxOptions::read(), |tx| {
        let h = health.clone();
        async move { tx.get(&h, false).await }
    })
    .await
    .expect("read")
    .expect("a health record");
    let o = &observed;
    let reaped =
        run(s.node.db().as_ref(), TxOptions::write(), |tx| async move { roster::reap(&tx, k, T, b"w1", o).await })
            .await
            .expect("reap");
    assert!(reaped, "reaped");
    let event = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await;
    s.fired(before);
    assert_eq!(event.ok().flatten(), Some(OwnerEvent::Reaped), "the owner is told of the reap");
    assert_eq!(s.log.count("worker_reinstated"), 1);
    // Never a second time.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(rx.try_recv().is_err(), "told once");
    assert_eq!(s.log.count("worker_reinstated"), 1);
    assert!(!reg.is_removed() && !reg.is_superseded());
    drop(reg);
    s.node.stop().await;
}
