//! No committed accept is lost (issue 12 item 3): an accept whose attempt
//! is cut off by the call's time budget while its commit waits in the
//! embedded store's group commit (`group::wait`) is committed anyway by the
//! batch (the `Stranded` path). Before, the call answered `timeout` and the
//! job stayed `running` under a token nobody held until the worker went.
//! Now the call answers `commit_unknown_result` and the job goes back to
//! pending.
//!
//! The schedule, on one store handle (one writer lock, FIFO):
//! A holds the writer lock 1.5 s; the accept (budget 2 s) queues behind
//! it once A holds it, B behind the accept 600 ms later, with 900 ms of
//! A's hold left. A defers its commit to the accept, the accept defers
//! its commit to B, and B holds the lock 4 s (under the store's 5 s
//! transaction age): the accept's budget ends
//! while it waits for the batch, which B then commits. (Before, the
//! accept had 50 ms to queue ahead of B, and A was taken to hold the
//! lock 50 ms after its task was spawned: a loaded machine broke both.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use couch_workers_core::jobs::JobState;
use couch_workers_core::log::Discard;
use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::{run, Db, StoreError, TxOptions};
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Error, Node, Settings};

mod jobs_common;
use jobs_common::until_not_running;

const T: &[u8] = b"t";
const W: &[u8] = b"w1";

/// A write transaction that holds the writer lock for `hold`; `held`
/// hears when it does.
async fn hold_writer(db: Db, key: &'static [u8], hold: Duration, held: tokio::sync::mpsc::UnboundedSender<()>) {
    let opts = TxOptions { writes: true, timeout: Duration::from_secs(20), retry_limit: 10 };
    run(db.as_ref(), opts, |tx| {
        let held = held.clone();
        async move {
            tx.set(key, b"1");
            let _ = held.send(());
            tokio::time::sleep(hold).await;
            Ok(())
        }
    })
    .await
    .expect("holder commits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accept_cut_off_in_the_group_commit_answers_unknown_and_its_job_goes_back() {
    let dir = tempfile::tempdir().expect("dir");
    let store = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open");
    let db: Db = store.clone();
    let settings = Settings { tx_timeout: Duration::from_secs(2), ..Settings::default() };
    let node = Node::with_db(db.clone(), settings, Arc::new(Discard));
    let spec = WorkerSpec { worker_type: T.to_vec(), id: W.to_vec(), options_json: b"{}".to_vec(), timeout_s: 600 };
    let _reg = node.register_worker(spec).await.expect("register");
    node.jobs().add(T, b"j", b"{}", 0).await.expect("add");

    let (held, mut a_holds) = tokio::sync::mpsc::unbounded_channel();
    let a = tokio::spawn(hold_writer(db.clone(), b"test-a", Duration::from_millis(1_500), held.clone()));
    a_holds.recv().await.expect("A holds the writer lock");
    let jobs = node.jobs().clone();
    let started = Instant::now();
    let accept = tokio::spawn(async move { jobs.accept(T, W, Duration::ZERO).await });
    tokio::time::sleep(Duration::from_millis(600)).await;
    let b = tokio::spawn(hold_writer(db.clone(), b"test-b", Duration::from_secs(4), held));
    let answer = accept.await.expect("accept task");
    let answered_in = started.elapsed();
    a.await.expect("a");
    b.await.expect("b");

    // The schedule happened as planned: the accept ran out of time while
    // B held the lock (B lets go about 5.5 s after the accept began), not
    // while it waited for A nor after B.
    assert!(answered_in < Duration::from_millis(4_500), "answered in {answered_in:?}");
    match answer {
        Err(Error::Store(StoreError::CommitUnknown)) => {}
        other => panic!("the accept's commit was cut off: expected commit_unknown_result, got {other:?}"),
    }
    // The job an unknown accept took goes back: pending, not running under
    // a token nobody holds.
    let job = until_not_running(node.jobs(), T, b"j", Duration::from_secs(10)).await;
    assert_eq!(job.state, JobState::Pending, "the job went back to pending: {job:?}");
    assert_eq!(job.attempts, 1, "the lost accept counts as an attempt");
    // And it can be taken again.
    let handle = node.jobs().accept(T, W, Duration::ZERO).await.expect("accept again");
    assert_eq!(handle.job.id, b"j".to_vec());
    node.stop().await;
}
