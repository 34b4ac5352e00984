//! A job taken for an acceptor that is gone when it arrives (a dead
//! caller, a dropped future) goes back to pending, also when the store
//! stalls at that moment: the give-back is retried until it lands, not
//! tried once and left to the log (the job would stay running for a live
//! worker that never heard of it, and nothing would ever end that run).
//!
//! The stall: every store call fails (retryable faults) from the moment
//! the delivery fails until a while after, longer than a transaction's
//! budget. On the embedded and the sim store and on a live FoundationDB,
//! for an accept with timeout
//! 0 (one transaction, no dispatcher) and one that waits (the
//! dispatcher's round).
//!
//! And a give-back whose commit lands but is answered
//! `commit_unknown_result` still logs `job_released` (its retry finds the
//! job pending by its own doing), on the `sim` store that scripts that
//! answer for it.

mod faults_common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use couch_workers_core::jobs::{AcceptReply, JobHandle, JobState, ReplyFn};
use couch_workers_core::keyspace::Keyspace;
use couch_workers_core::store::faulty::{FaultPlan, FaultyStore};
use couch_workers_core::store::sim::{SimOptions, SimStore};
use couch_workers_core::store::{Database, Db};
use couch_workers_core::test_store::{StoreKind, TestStore};
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Error, Node, Settings};
use faults_common::unknown_commit::UnknownOnWrite;
use faults_common::CaptureLog;

const T: &[u8] = b"t";
const W: &[u8] = b"w";
/// How long the store fails every call once a delivery failed: several
/// transaction budgets.
const STALL: Duration = Duration::from_secs(2);

fn settings() -> Settings {
    Settings { tx_timeout: Duration::from_millis(400), ..Settings::default() }
}

/// Every call fails (retryable) while enabled; off at first.
fn stall_plan() -> FaultPlan {
    FaultPlan { enabled: false, ..FaultPlan::retryable(5, 1.0) }
}

/// A reply whose acceptor is gone, and whose failed delivery starts a
/// stall of the store for [`STALL`].
/// The flag turns true once the delivery was tried.
fn gone_during_a_stall(faulty: &Arc<FaultyStore>) -> (Box<dyn AcceptReply>, Arc<AtomicBool>) {
    let faulty = faulty.clone();
    let delivered = Arc::new(AtomicBool::new(false));
    let flag = delivered.clone();
    let reply = Box::new(ReplyFn(move |outcome: Result<JobHandle, Error>| {
        assert!(outcome.is_ok(), "a job was taken: {outcome:?}");
        faulty.set_enabled(true);
        flag.store(true, Ordering::SeqCst);
        std::thread::spawn(move || {
            std::thread::sleep(STALL);
            faulty.set_enabled(false);
        });
        false
    }));
    (reply, delivered)
}

/// The job's state once the stall is over and the give-back had its
/// chance (polled: a read during a stall fails).
async fn state_after_the_stall(
    node: &Node,
    faulty: &FaultyStore,
    delivered: &AtomicBool,
    id: &[u8],
) -> (JobState, u64) {
    let deadline = tokio::time::Instant::now() + STALL + Duration::from_secs(15);
    loop {
        if delivered.load(Ordering::SeqCst) && !faulty.is_enabled() {
            if let Ok(job) = node.jobs().get(T, id).await {
                if job.state != JobState::Running || tokio::time::Instant::now() > deadline {
                    return (job.state, job.attempts);
                }
            }
        }
        assert!(tokio::time::Instant::now() < deadline + Duration::from_secs(5), "the store never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How many `job_released` lines the log has once the count reached
/// `expected` or 5 s passed: the line follows the give-back's commit,
/// which another transaction (the test's poll) may see first.
async fn released_lines(log: &CaptureLog, expected: usize) -> usize {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while log.count("job_released") < expected && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    log.count("job_released")
}

async fn given_back_after_a_stall(inner: Db) {
    let faulty = FaultyStore::wrap(inner, stall_plan());
    let log = CaptureLog::new();
    let node = Node::with_db(faulty.clone(), settings(), log.clone());
    // A worker that outlives the stall by far (never reaped meanwhile).
    let spec = WorkerSpec { worker_type: T.to_vec(), id: W.to_vec(), options_json: b"{}".to_vec(), timeout_s: 3600 };
    let _reg = node.register_worker(spec).await.expect("register");
    let jobs = node.jobs().clone();

    // An accept with timeout 0.
    jobs.add(T, b"now", b"{}", 0).await.expect("add");
    let (reply, delivered) = gone_during_a_stall(&faulty);
    jobs.accept_with(T.to_vec(), W.to_vec(), Duration::ZERO, reply);
    let (state, attempts) = state_after_the_stall(&node, &faulty, &delivered, b"now").await;
    assert_eq!(state, JobState::Pending, "given back after the stall (timeout 0)");
    assert_eq!(attempts, 1, "the accept counted");
    assert!(log.count("job_release_failed") >= 1, "the failed try is logged");
    assert_eq!(released_lines(&log, 1).await, 1);

    // An accept that waits: the dispatcher's round takes the job again.
    let (reply, delivered) = gone_during_a_stall(&faulty);
    jobs.accept_with(T.to_vec(), W.to_vec(), Duration::from_secs(30), reply);
    let (state, attempts) = state_after_the_stall(&node, &faulty, &delivered, b"now").await;
    assert_eq!(state, JobState::Pending, "given back after the stall (dispatcher)");
    assert_eq!(attempts, 2);
    assert_eq!(released_lines(&log, 2).await, 2);
    let again = jobs.accept(T, W, Duration::ZERO).await.expect("accept");
    assert_eq!(again.job.id, b"now", "it can be taken again");
    jobs.finish(&again.fence(), b"{}").await.expect("and finished");
    node.stop().await;
}

async fn a_give_back_during_a_stall_lands_after_it(kind: StoreKind) {
    let store = TestStore::with_seed(kind, 3);
    given_back_after_a_stall(store.db()).await;
}

// The stall is the fault wrapper's (every call of the node fails), not the
// store's: it runs on a live FoundationDB as well.
couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread", worker_threads = 2),
    stores: [embedded: Embedded, sim: Sim],
    tests: [a_give_back_during_a_stall_lands_after_it],
);

/// The give-back's commit lands and is answered `commit_unknown_result`;
/// the retry finds the job pending (its own write): `job_released` is
/// logged once, not nothing (as when the retry took the job for one
/// another write had given back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_landed_unknown_give_back_logs_job_released() {
    let sim = SimStore::new(SimOptions::new(21));
    // The fault waits for a write of the job's record after it is armed:
    // the give-back's.
    let record = Keyspace::new(&sim.prefix()).job(T, b"j");
    let fault = UnknownOnWrite::new(sim, record, true);
    let log = CaptureLog::new();
    let node = Node::with_db(fault.db(), settings(), log.clone());
    let spec = WorkerSpec { worker_type: T.to_vec(), id: W.to_vec(), options_json: b"{}".to_vec(), timeout_s: 3600 };
    let _reg = node.register_worker(spec).await.expect("register");
    let jobs = node.jobs().clone();
    jobs.add(T, b"j", b"{}", 0).await.expect("add");
    let before = fault.sim().stats().unknown_committed;
    let armer = fault.clone();
    // The acceptor is gone when the job arrives: the job is given back.
    let reply = Box::new(ReplyFn(move |outcome: Result<JobHandle, Error>| {
        assert!(outcome.is_ok(), "a job was taken: {outcome:?}");
        armer.arm();
        false
    }));
    jobs.accept_with(T.to_vec(), W.to_vec(), Duration::ZERO, reply);
    assert_eq!(released_lines(&log, 1).await, 1, "the landed give-back is logged: {:?}", log.events());
    fault.fired(before);
    let job = jobs.get(T, b"j").await.expect("get");
    assert_eq!((job.state, job.attempts), (JobState::Pending, 1));
    // Once: the retry answered from the receipt.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(log.count("job_released"), 1);
    assert_eq!(log.count("job_release_skipped"), 0);
    node.stop().await;
}
