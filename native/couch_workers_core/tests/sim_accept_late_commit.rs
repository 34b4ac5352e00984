//! An accept whose commit was cut off by the call's time budget but lands
//! later strands no job (the 100,000-job simulation's four never-accepted
//! jobs).
//!
//! On FoundationDB (and the sim store) a commit whose caller stopped
//! waiting may still be applied. The accept answers
//! `commit_unknown_result` and a reclaim gives back what it took; before
//! the fix, a reclaim that ran before the late commit landed found
//! nothing, committed read-only, and the job then stayed `running` under a
//! token nobody held, for a live worker that is never reaped: no accept
//! could take it again.
//!
//! Deterministic schedule: commits take 400 ms and the time budget is
//! 150 ms, so the accept's commit is always cut off and lands 400 ms after
//! it was sent, after the reclaim's first read.

use std::sync::Arc;
use std::time::Duration;

use couch_workers_core::jobs::JobState;
use couch_workers_core::log::Discard;
use couch_workers_core::store::sim::{Latency, SimFaults, SimOptions, SimStore};
use couch_workers_core::store::{Db, StoreError};
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Error, Node, Settings};

mod jobs_common;
use jobs_common::until_not_running;

const T: &[u8] = b"t";
const W: &[u8] = b"w1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accept_that_lands_after_its_reclaim_strands_no_job() {
    let sim = SimStore::new(SimOptions::new(21));
    let db: Db = sim.clone();
    // No reaper pass during the schedule: its pulse commit would share the
    // proxy's batches.
    let settings = Settings {
        tx_timeout: Duration::from_millis(150),
        reaper_max_interval: Duration::from_secs(60),
        ..Settings::default()
    };
    let node = Node::with_db(db, settings, Arc::new(Discard));
    let spec = WorkerSpec { worker_type: T.to_vec(), id: W.to_vec(), options_json: b"{}".to_vec(), timeout_s: 600 };
    let _reg = node.register_worker(spec).await.expect("register");
    node.jobs().add(T, b"j", b"{}", 0).await.expect("add");

    let slow = SimFaults { commit_latency: Latency::fixed(Duration::from_millis(400)), ..SimFaults::none() };
    sim.set_faults(slow);
    // A proxy still running with no latency would take the accept's commit
    // at once: let it go idle first (it stops when its queue is empty).
    tokio::time::sleep(Duration::from_millis(100)).await;
    match node.jobs().accept(T, W, Duration::ZERO).await {
        Err(Error::Store(StoreError::CommitUnknown)) => {}
        other => panic!("the accept's commit was cut off: expected commit_unknown_result, got {other:?}"),
    }
    // The late commit lands, the reclaim retries past it; then the store
    // is fast again.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    sim.set_faults(SimFaults::none());
    // (A proxy batch already waiting its 400 ms ends first.)
    tokio::time::sleep(Duration::from_millis(500)).await;

    let job = until_not_running(node.jobs(), T, b"j", Duration::from_secs(10)).await;
    assert_eq!(job.state, JobState::Pending, "the job went back to pending, not running for nobody: {job:?}");
    let handle = node.jobs().accept(T, W, Duration::from_secs(5)).await.expect("accept again");
    assert_eq!(handle.job.id, b"j".to_vec());
    node.stop().await;
}
