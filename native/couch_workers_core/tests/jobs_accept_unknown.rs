//! No committed accept is lost: an accept whose attempt
//! is cut off by the call's time budget while its commit waits in the
//! embedded store's group commit (`group::wait`) is committed anyway by the
//! batch (the `Stranded` path). Before, the call answered `timeout` and the
//! job stayed `running` under a token nobody held until the worker went.
//! Now the call answers `commit_unknown_result` and the job goes back to
//! pending. Now the retry loop first waits for the batch's
//! outcome for the store's grace (`Database::commit_grace`: here 2 s, the
//! cap); B holds the batch open until the accept has answered, so the
//! grace runs out too and the outcome stays unknown to the call
//! (`tests/embedded_commit_truth.rs` has the batch decided within it).
//!
//! The schedule, on one store handle (one writer lock, FIFO), driven by
//! events, not by sleeps: A holds the writer lock; the accept (budget 4 s,
//! room for a loaded machine to reach B's hold) queues behind it, and B
//! behind the accept, each seen queued (`EmbeddedStore::writers_queued`)
//! before the next step. Then A lets go:
//! A defers its commit to the accept, the accept defers its commit to B,
//! and B holds the lock until the accept has answered: the accept's budget
//! ends while it waits for the batch, which B then commits. (An earlier
//! schedule gave B 600 ms to queue and A 1.5 s of hold: once under
//! extreme load B queued late, the accept committed alone and rightly
//! answered `Ok`.)

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

/// A write transaction that holds the writer lock until `release`;
/// `held` hears when it holds it.
async fn hold_writer(
    db: Db,
    key: &'static [u8],
    held: tokio::sync::mpsc::UnboundedSender<&'static [u8]>,
    release: tokio::sync::oneshot::Receiver<()>,
) {
    let opts = TxOptions { writes: true, timeout: Duration::from_secs(60), retry_limit: 10 };
    let release = std::sync::Mutex::new(Some(release));
    run(db.as_ref(), opts, |tx| {
        let held = held.clone();
        // A retry (there should be none) does not hold again.
        let release = release.lock().unwrap().take();
        async move {
            tx.set(key, b"1");
            let _ = held.send(key);
            if let Some(release) = release {
                let _ = release.await;
            }
            Ok(())
        }
    })
    .await
    .expect("holder commits");
}

/// Waits until `n` writers of `store` are queued for its writer lock.
async fn until_queued(store: &EmbeddedStore, n: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.writers_queued() < n {
        assert!(Instant::now() < deadline, "{what} never queued for the writer lock");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accept_cut_off_in_the_group_commit_answers_unknown_and_its_job_goes_back() {
    let dir = tempfile::tempdir().expect("dir");
    // B's transaction lives as long as the accept's budget: keep it under
    // the store's transaction age on any machine.
    let mut opts = EmbeddedOptions::new(dir.path());
    opts.max_transaction_age = Duration::from_secs(60);
    let store = EmbeddedStore::open(opts).expect("open");
    let db: Db = store.clone();
    let settings = Settings { tx_timeout: Duration::from_secs(4), ..Settings::default() };
    let node = Node::with_db(db.clone(), settings, Arc::new(Discard));
    let spec = WorkerSpec { worker_type: T.to_vec(), id: W.to_vec(), options_json: b"{}".to_vec(), timeout_s: 600 };
    let _reg = node.register_worker(spec).await.expect("register");
    node.jobs().add(T, b"j", b"{}", 0).await.expect("add");

    let (held, mut holds) = tokio::sync::mpsc::unbounded_channel();
    let (release_a, a_release) = tokio::sync::oneshot::channel();
    let (release_b, b_release) = tokio::sync::oneshot::channel();
    let a = tokio::spawn(hold_writer(db.clone(), b"test-a", held.clone(), a_release));
    assert_eq!(holds.recv().await, Some(&b"test-a"[..]), "A holds the writer lock");
    // Writers of the node's own (start-up passes) may be queued too.
    let others = store.writers_queued();
    let jobs = node.jobs().clone();
    let accept = tokio::spawn(async move { jobs.accept(T, W, Duration::ZERO).await });
    until_queued(&store, others + 1, "the accept").await;
    let b = tokio::spawn(hold_writer(db.clone(), b"test-b", held, b_release));
    until_queued(&store, others + 2, "B").await;
    release_a.send(()).expect("A waits");
    // B gets the lock after the accept, and keeps it until the accept has
    // answered: whatever the accept answers, it answers while B holds the
    // lock with the accept's commit in B's batch.
    assert_eq!(holds.recv().await, Some(&b"test-b"[..]), "B holds the writer lock");
    let answer = accept.await.expect("accept task");
    release_b.send(()).expect("B waits");
    a.await.expect("a");
    b.await.expect("b");

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
