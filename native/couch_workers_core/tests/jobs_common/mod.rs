//! Helpers shared by the `jobs_*` test files: nodes on one test store
//! (`Cluster::new` the embedded store in a temporary directory,
//! `Cluster::on` any [`StoreKind`], a live FoundationDB included; several
//! "nodes" = several handles on one store, as several Erlang nodes open
//! it), workers, raw reads.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use couch_workers_core::jobs::{Fence, Job, JobEvent, JobHandle, JobService, JobState, OnJobEvent};
use couch_workers_core::keyspace::Keyspace;
use couch_workers_core::log::Discard;
use couch_workers_core::store::embedded::EmbeddedStore;
use couch_workers_core::store::{run, Db, RangeRequest, TxOptions};
pub use couch_workers_core::test_store::{StoreKind, TestStore};
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Node, Registration, Settings};
use tokio::sync::mpsc;

pub struct Cluster {
    pub store: TestStore,
}

impl Cluster {
    /// On the embedded store, in a temporary directory.
    pub fn new() -> Self {
        Self::on(StoreKind::Embedded)
    }

    /// On a fresh store of `kind`.
    pub fn on(kind: StoreKind) -> Self {
        Cluster { store: TestStore::new(kind) }
    }

    pub fn kind(&self) -> StoreKind {
        self.store.kind()
    }

    /// A new handle on the store (what a node opens).
    pub fn db(&self) -> Db {
        self.store.db()
    }

    /// A node: its own store handle on the shared store.
    pub fn node(&self) -> Arc<Node> {
        self.node_with(Settings::default())
    }

    /// The same with these settings.
    pub fn node_with(&self, settings: Settings) -> Arc<Node> {
        Node::with_db(self.db(), settings, Arc::new(Discard))
    }

    /// A node and its store handle (to count the store's watches): the
    /// embedded store only.
    pub fn node_and_store(&self) -> (Arc<Node>, Arc<EmbeddedStore>) {
        let store = self.store.embedded().expect("an embedded store");
        let db: Db = store.clone();
        (Node::with_db(db, Settings::default(), Arc::new(Discard)), store)
    }
}

pub fn spec(worker_type: &[u8], id: &[u8]) -> WorkerSpec {
    WorkerSpec { worker_type: worker_type.to_vec(), id: id.to_vec(), options_json: b"{}".to_vec(), timeout_s: 15 }
}

pub async fn register(node: &Arc<Node>, worker_type: &[u8], id: &[u8]) -> Registration {
    node.register_worker(spec(worker_type, id)).await.expect("register")
}

pub fn info(n: usize) -> Vec<u8> {
    format!("{{\"n\":{n}}}").into_bytes()
}

pub async fn add(jobs: &JobService, t: &[u8], id: &[u8], priority: i64) {
    jobs.add(t, id, &info(0), priority).await.expect("add");
}

pub async fn get(jobs: &JobService, t: &[u8], id: &[u8]) -> Job {
    jobs.get(t, id).await.expect("get")
}

pub async fn accept_now(jobs: &JobService, t: &[u8], worker: &[u8]) -> JobHandle {
    jobs.accept(t, worker, Duration::ZERO).await.expect("a job to accept")
}

pub fn fence(h: &JobHandle) -> Fence {
    h.fence()
}

/// Every key-value pair under a key range of the node's key space.
pub async fn range(node: &Node, (begin, end): (Vec<u8>, Vec<u8>)) -> Vec<(Vec<u8>, Vec<u8>)> {
    let r = RangeRequest::new(begin, end);
    run(node.db().as_ref(), TxOptions::read(), |tx| {
        let r = r.clone();
        async move { tx.get_range(&r).await }
    })
    .await
    .expect("range read")
}

pub async fn raw_get(node: &Node, key: &[u8]) -> Option<Vec<u8>> {
    run(node.db().as_ref(), TxOptions::read(), |tx| async move { tx.get(key, false).await }).await.expect("read")
}

pub async fn active_keys(node: &Node, t: &[u8], worker: &[u8]) -> usize {
    range(node, node.keyspace().active_range(t, worker)).await.len()
}

pub async fn pending_keys(node: &Node, t: &[u8]) -> usize {
    range(node, node.keyspace().pending_range(t)).await.len()
}

pub fn ks(node: &Node) -> &Keyspace {
    node.keyspace()
}

/// A subscription callback feeding a channel.
pub fn events() -> (OnJobEvent, mpsc::UnboundedReceiver<JobEvent>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let tx = Mutex::new(tx);
    (
        Box::new(move |e| {
            let _ = tx.lock().unwrap().send(e);
        }),
        rx,
    )
}

/// The next event within 5 s.
pub async fn next_event(rx: &mut mpsc::UnboundedReceiver<JobEvent>) -> JobEvent {
    tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("an event within 5 s").expect("channel open")
}

/// Events until one shows `state` (skipping intermediate ones).
pub async fn wait_state(rx: &mut mpsc::UnboundedReceiver<JobEvent>, state: JobState) -> Job {
    loop {
        match next_event(rx).await {
            JobEvent::Changed(job) if job.state == state => return job,
            JobEvent::Changed(_) => continue,
            JobEvent::Removed => panic!("removed while waiting for {state:?}"),
        }
    }
}

/// Polls `f` until it holds, for up to `within`.
pub async fn eventually<F, Fut>(within: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if f().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Reads the job until it is no longer `running`, for up to `within`;
/// returns it as last read (still running if the time ran out).
pub async fn until_not_running(jobs: &JobService, t: &[u8], id: &[u8], within: Duration) -> Job {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let job = jobs.get(t, id).await.expect("get");
        if job.state != JobState::Running || tokio::time::Instant::now() > deadline {
            return job;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until a new node on `sim` (before anything is registered on it)
/// has made its start-up writes and gone to sleep: each of its five
/// background services (the reaper on `health_vs`, the promoter on
/// `scheduled_vs`, the pruner on `expiry_vs`, the orphan sweeper on
/// `orphans_vs`, the activity observer on `activity_vs`) arms its watch
/// only after its first pass's writes, so five armed watches mean that no
/// start-up write is still on its way. What the test
/// writes next wakes only read-only passes (the reaper's look at a live
/// worker), which no scripted commit fault can meet. Counts, not a sleep:
/// a loaded machine only makes the wait longer. A new service that
/// sleeps on a watch must raise `SERVICES`, or this waits too little.
pub async fn sim_node_settled(sim: &couch_workers_core::store::sim::SimStore) {
    const SERVICES: usize = 5;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while sim.stats().armed_watches < SERVICES {
        assert!(tokio::time::Instant::now() < deadline, "the node's services never all slept: {:?}", sim.stats());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
