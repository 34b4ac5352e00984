//! A call's outcome is the store's outcome: every job write, when its
//! commit landed but was answered
//! `commit_unknown_result` and the retry loop ran it again on top of its
//! own write, answers for that write (`ok`), not as if someone else had
//! made it (`already_exists`, `not_owner`, `not_found`).
//!
//! On the `sim` store, one scripted `UnknownCommitted` fault at a time.
//! The node's background tasks are kept quiet (a worker timeout of an
//! hour: its heartbeat is 20 minutes away; the reaper's longest sleep an
//! hour), so that the scripted fault is the call's commit; each test checks
//! that it was (one `unknown_committed` more, and the call's own effect in
//! the store exactly once).

mod jobs_common;

use std::sync::Arc;
use std::time::Duration;

use couch_workers_core::jobs::{JobHandle, JobOpts, JobSpec, JobState, NewJob, Retry};
use couch_workers_core::log::Discard;
use couch_workers_core::store::sim::{CommitFault, SimOptions, SimStore};
use couch_workers_core::store::Db;
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Error, Node, Registration, Settings};

const T: &[u8] = b"t";
const W: &[u8] = b"w1";

struct Quiet {
    sim: Arc<SimStore>,
    node: Arc<Node>,
    _reg: Option<Registration>,
}

async fn quiet(seed: u64, worker: bool) -> Quiet {
    let sim = SimStore::new(SimOptions::new(seed));
    let settings = Settings { reaper_max_interval: Duration::from_secs(3600), ..Settings::default() };
    let node = Node::with_db(sim.connect() as Db, settings, Arc::new(Discard));
    // The start-up writes (the pruner's first receipt clear, the first
    // reaper pass) land before anything else, and before any fault is
    // scripted.
    jobs_common::sim_node_settled(&sim).await;
    let reg = if worker {
        let spec =
            WorkerSpec { worker_type: T.to_vec(), id: W.to_vec(), options_json: b"{}".to_vec(), timeout_s: 3600 };
        Some(node.register_worker(spec).await.expect("register"))
    } else {
        None
    };
    Quiet { sim, node, _reg: reg }
}

impl Quiet {
    /// Runs `call` with its commit answered `commit_unknown_result` after
    /// it landed; checks that the call's commit took the fault.
    async fn landed_unknown<T, F: std::future::Future<Output = T>>(&self, call: F) -> T {
        let before = self.sim.stats().unknown_committed;
        self.sim.inject_commit_fault(CommitFault::UnknownCommitted);
        let out = call.await;
        assert_eq!(self.sim.stats().unknown_committed, before + 1, "the scripted fault was used");
        out
    }

    async fn accepted(&self) -> JobHandle {
        self.node.jobs().accept(T, W, Duration::ZERO).await.expect("accept")
    }

    async fn state(&self, id: &[u8]) -> JobState {
        self.node.jobs().get(T, id).await.expect("get").state
    }
}

fn new_job(id: &str) -> NewJob {
    NewJob { id: id.as_bytes().to_vec(), info: b"{}".to_vec(), priority: 0 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_answers_ok_for_its_own_landed_commit() {
    let q = quiet(1, false).await;
    let jobs = q.node.jobs();
    assert_eq!(q.landed_unknown(jobs.add(T, b"j1", b"{}", 0)).await, Ok(()));
    let opts = JobOpts::default();
    assert_eq!(q.landed_unknown(jobs.add_with(T, b"j2", b"{}", &opts)).await, Ok(()));
    assert_eq!(jobs.pending_count(T).await, Ok(2), "each added once");
    // Someone else's job is still `already_exists`.
    assert_eq!(jobs.add(T, b"j1", b"{}", 0).await, Err(Error::AlreadyExists));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_many_answers_ok_for_its_own_landed_commit() {
    let q = quiet(2, false).await;
    let jobs = q.node.jobs();
    let batch: Vec<NewJob> = (0..5).map(|i| new_job(&format!("j{i}"))).collect();
    assert_eq!(q.landed_unknown(jobs.add_many(T, &batch)).await.map_err(|e| format!("{e:?}")), Ok(()));
    let specs: Vec<JobSpec> = (5..8)
        .map(|i| JobSpec { id: format!("j{i}").into_bytes(), info: b"{}".to_vec(), opts: JobOpts::default() })
        .collect();
    assert_eq!(q.landed_unknown(jobs.add_many_with(T, &specs)).await.map_err(|e| format!("{e:?}")), Ok(()));
    assert_eq!(jobs.pending_count(T).await, Ok(8));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finish_fail_release_answer_ok_for_their_own_landed_commit() {
    let q = quiet(3, true).await;
    let jobs = q.node.jobs();
    for id in ["f", "x", "r"] {
        jobs.add(T, id.as_bytes(), b"{}", 0).await.expect("add");
    }
    let h = q.accepted().await;
    assert_eq!(q.landed_unknown(jobs.finish(&h.fence(), b"{}")).await, Ok(()), "finish of {:?}", h.job.id);
    assert_eq!(q.state(&h.job.id).await, JobState::Finished);
    let h = q.accepted().await;
    assert_eq!(q.landed_unknown(jobs.fail(&h.fence(), b"{}", Retry::No)).await, Ok(()));
    assert_eq!(q.state(&h.job.id).await, JobState::Failed);
    let h = q.accepted().await;
    assert_eq!(q.landed_unknown(jobs.release(&h.fence(), &JobOpts::default(), None)).await, Ok(()));
    assert_eq!(q.state(&h.job.id).await, JobState::Pending);
    assert_eq!(jobs.pending_count(T).await, Ok(1), "released once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_cancel_resubmit_answer_ok_for_their_own_landed_commit() {
    let q = quiet(4, false).await;
    let jobs = q.node.jobs();
    for id in ["a", "b"] {
        jobs.add(T, id.as_bytes(), b"{}", 0).await.expect("add");
    }
    assert_eq!(q.landed_unknown(jobs.remove(T, b"a")).await, Ok(()));
    assert_eq!(jobs.get(T, b"a").await.map(|j| j.state), Err(Error::NotFound));
    let vs = jobs.get(T, b"b").await.expect("get").vs;
    assert_eq!(q.landed_unknown(jobs.remove_if(T, b"b", Some(&vs))).await, Ok(()));
    jobs.add(T, b"c", b"{}", 0).await.expect("add");
    assert_eq!(q.landed_unknown(jobs.cancel(T, b"c")).await, Ok(()));
    assert_eq!(q.state(b"c").await, JobState::Canceled);
    let vs = jobs.get(T, b"c").await.expect("get").vs;
    let opts = JobOpts::default();
    assert_eq!(q.landed_unknown(jobs.resubmit(T, b"c", b"{}", &opts, Some(&vs))).await, Ok(()));
    assert_eq!(q.state(b"c").await, JobState::Pending);
    assert_eq!(jobs.pending_count(T).await, Ok(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_answers_for_its_own_landed_commit() {
    let q = quiet(5, true).await;
    let jobs = q.node.jobs();
    jobs.add(T, b"u", b"{}", 0).await.expect("add");
    let h = q.accepted().await;
    let updated = q.landed_unknown(jobs.update(&h.fence(), b"{\"step\":1}")).await.expect("update");
    assert_eq!(updated.job.info, b"{\"step\":1}".to_vec());
    assert_eq!(updated.job.vs, jobs.get(T, b"u").await.expect("get").vs, "the landed write's VS");
    // After a cancel request, the update that wrote the cancellation says so.
    jobs.cancel(T, b"u").await.expect("cancel");
    assert_eq!(q.landed_unknown(jobs.update(&updated.fence(), b"{}")).await.map(|_| ()), Err(Error::Canceled));
    assert_eq!(q.state(b"u").await, JobState::Canceled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_older_than_their_keep_are_cleared_in_one_range() {
    use couch_workers_core::store::receipt::{clear_old, minute_now, KEEP_MINUTES};
    use couch_workers_core::store::{run, RangeRequest, TxOptions};
    let q = quiet(6, false).await;
    let ks = q.node.keyspace().clone();
    let now = minute_now();
    let (old, kept) = (ks.receipt(now - KEEP_MINUTES - 1, b"old"), ks.receipt(now - KEEP_MINUTES, b"kept"));
    let db = q.node.db().clone();
    let (o, k, ks2) = (&old, &kept, &ks);
    run(db.as_ref(), TxOptions::write(), |tx| async move {
        tx.set(o, b"done");
        tx.set(k, b"done");
        Ok(())
    })
    .await
    .expect("write receipts");
    run(db.as_ref(), TxOptions::write(), |tx| async move {
        clear_old(&tx, ks2, now);
        Ok(())
    })
    .await
    .expect("clear");
    let (begin, end) = ks.receipts_before(i64::MAX);
    let left = run(db.as_ref(), TxOptions::read(), |tx| {
        let r = RangeRequest::new(begin.clone(), end.clone());
        async move { tx.get_range(&r).await }
    })
    .await
    .expect("read");
    let keys: Vec<Vec<u8>> = left.into_iter().map(|(k, _)| k).collect();
    assert!(keys.contains(&kept), "a receipt within its keep stays");
    assert!(!keys.contains(&old), "a receipt past its keep is cleared");
}

/// A dispatcher round whose attempt took the job and landed (answered
/// unknown) ends in an error when no retry is left (a retry limit of 1
/// here; on a busy cluster, the time budget or the attempt limit). Before,
/// the waiters went back to the queue with new tokens and the job stayed
/// `running` under the old one, which nobody held: the waiter timed out
/// and the job was stuck until the worker went. Now the round's jobs go
/// back to pending and the next round hands the job to the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_round_after_a_landed_commit_strands_no_job() {
    let sim = SimStore::new(SimOptions::new(7));
    let settings =
        Settings { reaper_max_interval: Duration::from_secs(3600), tx_retry_limit: 1, ..Settings::default() };
    let node = Node::with_db(sim.connect() as Db, settings, Arc::new(Discard));
    // Settled before the registration: with one attempt per transaction,
    // the reaper's first pass could otherwise fail on a conflict with it.
    jobs_common::sim_node_settled(&sim).await;
    let spec = WorkerSpec { worker_type: T.to_vec(), id: W.to_vec(), options_json: b"{}".to_vec(), timeout_s: 3600 };
    let _reg = node.register_worker(spec).await.expect("register");
    let jobs = node.jobs();
    jobs.add(T, b"j", b"{}", 0).await.expect("add");
    let before = sim.stats();
    sim.inject_commit_fault(CommitFault::UnknownCommitted);
    let handle = jobs.accept(T, W, Duration::from_secs(5)).await.expect("the waiter gets the job");
    let after = sim.stats();
    assert_eq!(
        after.unknown_committed,
        before.unknown_committed + 1,
        "the round's first commit landed, answered unknown"
    );
    assert_eq!(handle.job.id, b"j".to_vec());
    assert_eq!(jobs.finish(&handle.fence(), b"{}").await, Ok(()), "the handle holds the job");
    assert_eq!(jobs.get(T, b"j").await.expect("get").state, JobState::Finished);
}

async fn receipt_count(node: &Node) -> usize {
    use couch_workers_core::store::{run, RangeRequest, TxOptions};
    let (begin, end) = node.keyspace().receipts_before(i64::MAX);
    run(node.db().as_ref(), TxOptions::read(), |tx| {
        let r = RangeRequest::new(begin.clone(), end.clone());
        async move { tx.get_range(&r).await }
    })
    .await
    .expect("read receipts")
    .len()
}

/// A receipt per job write where commits may be unknown (`sim`, as
/// FoundationDB); none on the embedded store, which knows every commit's
/// outcome (its figures in bench/RESULTS.md stay those without receipts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_are_written_only_where_a_commit_may_be_unknown() {
    let q = quiet(8, false).await;
    q.node.jobs().add(T, b"a", b"{}", 0).await.expect("add");
    q.node.jobs().remove(T, b"a").await.expect("remove");
    assert_eq!(receipt_count(&q.node).await, 2, "sim: one receipt per write");

    use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
    let dir = tempfile::tempdir().expect("dir");
    let store = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open");
    let node = Node::with_db(store as Db, Settings::default(), Arc::new(Discard));
    node.jobs().add(T, b"a", b"{}", 0).await.expect("add");
    node.jobs().remove(T, b"a").await.expect("remove");
    assert_eq!(receipt_count(&node).await, 0, "embedded: none");
    node.stop().await;
}
