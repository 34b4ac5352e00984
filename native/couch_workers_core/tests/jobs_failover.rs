//! Failover: a removed (unregistered, reaped) worker's running jobs go
//! back to pending with their attempts, its handles are refused (also
//! after the same worker takes the job again), and a worker with many
//! running jobs is requeued in bounded transactions, the rest by the
//! sweeper.

mod jobs_common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use couch_workers_core::jobs::ops::{self, SweepStep, Take, BATCH_WRITE_BUDGET, REQUEUE_MAX_JOBS};
use couch_workers_core::jobs::{Fence, JobHandle, JobState, NewJob};
use couch_workers_core::keyspace::{Incarnation, Keyspace};
use couch_workers_core::roster;
use couch_workers_core::store::hooked::{Hooked, TxHooks, Write};
use couch_workers_core::store::{run, Db, RangeRequest, StoreError, Tx, TxOptions, MAX_TRANSACTION_SIZE};
use couch_workers_core::workers;
use couch_workers_core::Error;
use jobs_common::*;

const T: &[u8] = b"replicator";

/// The incarnation of the workers these tests register by hand.
const INC: Incarnation = [9; 16];

async fn unregistered_worker_jobs_go_back_to_pending_and_its_handles_are_refused(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let reg = register(&node, T, b"w").await;
    for id in [b"a", b"b", b"c"] {
        add(jobs, T, id, 0).await;
    }
    let ha = accept_now(jobs, T, b"w").await;
    let hb = accept_now(jobs, T, b"w").await;
    jobs.cancel(T, b"b").await.unwrap();
    assert_eq!(jobs.pending_count(T).await.unwrap(), 1);
    node.unregister_worker(&reg).await.unwrap();

    let a = get(jobs, T, b"a").await;
    assert_eq!((a.state, a.worker.clone(), a.attempts), (JobState::Pending, None, 1));
    assert!(a.vs > ha.job.vs);
    let b = get(jobs, T, b"b").await;
    assert_eq!(b.state, JobState::Canceled, "a cancel requested while it ran is honoured on failover");
    assert_eq!(jobs.pending_count(T).await.unwrap(), 2);
    assert_eq!(active_keys(&node, T, b"w").await, 0);
    assert_eq!(jobs.update(&ha.fence(), b"{}").await, Err(Error::NotOwner));
    assert_eq!(jobs.finish(&hb.fence(), b"{}").await, Err(Error::NotOwner));

    // The same worker comes back and takes the job again: attempts 2, and
    // the first accept's handle is still refused.
    let _again = register(&node, T, b"w").await;
    // A requeued job goes to the back of its priority: `c`, never
    // accepted, comes first.
    let hc = accept_now(jobs, T, b"w").await;
    assert_eq!(hc.job.id, b"c");
    assert_eq!(hc.job.attempts, 1);
    let ha2 = accept_now(jobs, T, b"w").await;
    assert_eq!(ha2.job.id, b"a");
    assert_eq!(ha2.job.attempts, 2);
    assert_ne!(ha2.token, ha.token);
    assert_eq!(jobs.update(&ha.fence(), b"{}").await, Err(Error::NotOwner));
    assert_eq!(jobs.finish(&ha.fence(), b"{}").await, Err(Error::NotOwner));
    jobs.update(&ha2.fence(), b"{}").await.unwrap();
    jobs.finish(&ha2.fence(), b"{}").await.unwrap();
    node.stop().await;
}

async fn removal_in_the_workers_transaction_and_by_the_reaper(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let other = c.node();
    let jobs = node.jobs();
    let ks = node.keyspace().clone();

    // roster::remove in a transaction of its own (what a reap does).
    let w = register(&node, T, b"w").await;
    add(jobs, T, b"x", 0).await;
    let hx = accept_now(jobs, T, b"w").await;
    let (k, inc) = (&ks, w.incarnation());
    let removed =
        run(node.db().as_ref(), TxOptions::write(), |tx| async move { roster::remove(&tx, k, T, b"w", inc).await })
            .await
            .unwrap();
    assert!(removed);
    assert_eq!(get(jobs, T, b"x").await.state, JobState::Pending);
    assert_eq!(jobs.finish(&hx.fence(), b"{}").await, Err(Error::NotOwner));

    // A worker whose heartbeats stop (registered without a heartbeat task,
    // timeout 1 s) is reaped by a node's reaper; its job goes back.
    let short = workers::WorkerSpec { timeout_s: 1, ..spec(T, b"silent") };
    let s = &short;
    run(node.db().as_ref(), TxOptions::write(), |tx| async move { roster::register(&tx, k, s, &INC, 0).await })
        .await
        .unwrap();
    let hs = accept_now(other.jobs(), T, b"silent").await;
    assert_eq!(hs.job.id, b"x");
    assert!(
        eventually(Duration::from_secs(5), || async { get(jobs, T, b"x").await.state == JobState::Pending }).await,
        "reaped and requeued"
    );
    assert_eq!(get(jobs, T, b"x").await.attempts, 2);
    assert_eq!(other.jobs().update(&hs.fence(), b"{}").await, Err(Error::NotOwner));
    node.stop().await;
    other.stop().await;
}

// ---- batching ------------------------------------------------------------

/// Counts the bytes a transaction writes, and the pending keys (keys
/// under `pending`) it writes: the jobs it queues.
struct Meter {
    written: AtomicUsize,
    pending: (Vec<u8>, Vec<u8>),
    queued: AtomicUsize,
}

impl Meter {
    fn new(ks: &Keyspace) -> Self {
        Meter { written: AtomicUsize::new(0), pending: ks.pending_range(T), queued: AtomicUsize::new(0) }
    }
}

impl TxHooks for Meter {
    fn write(&self, write: Write<'_>) {
        self.written.fetch_add(write.size(), Ordering::SeqCst);
        if let Write::SetVersionstampedKey { key, .. } = write {
            if key >= self.pending.0.as_slice() && key < self.pending.1.as_slice() {
                self.queued.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

/// Removes `worker` (`roster::remove`) in one metered transaction:
/// (jobs moved, bytes written). The jobs moved are the pending keys that
/// transaction wrote: before, the pending count read after its commit,
/// which a node's sweeper woken by the marker (what one test checks)
/// could already have raised by the rest (550 instead of 500).
async fn remove_metered(db: &Db, ks: &Keyspace, worker: &[u8]) -> (usize, usize) {
    let tx = db.create_transaction(&TxOptions::write()).await.unwrap();
    let metered = Arc::new(Hooked::new(tx, Meter::new(ks)));
    let as_tx: Tx = metered.clone();
    assert!(roster::remove(&as_tx, ks, T, worker, &INC).await.unwrap());
    as_tx.commit().await.unwrap();
    (metered.hooks().queued.load(Ordering::SeqCst), metered.hooks().written.load(Ordering::SeqCst))
}

async fn write<F, Fut, R>(db: &Db, f: F) -> R
where
    F: FnMut(Tx) -> Fut,
    Fut: std::future::Future<Output = Result<R, StoreError>>,
{
    run(db.as_ref(), TxOptions { timeout: Duration::from_secs(20), ..TxOptions::write() }, f).await.unwrap()
}

/// Adds `n` jobs with `info_len`-byte infos and has `worker` accept them
/// all, in big transactions; returns the handles.
async fn setup_running(db: &Db, ks: &Keyspace, worker: &[u8], n: usize, info_len: usize) -> Vec<JobHandle> {
    let s = spec(T, worker);
    let s = &s;
    write(db, |tx| async move { roster::register(&tx, ks, s, &INC, 0).await }).await;
    let filler = "x".repeat(info_len.saturating_sub(10));
    let batch: Vec<NewJob> = (0..n)
        .map(|i| NewJob {
            id: format!("j{i:05}").into_bytes(),
            info: format!("{{\"f\":\"{filler}\"}}").into_bytes(),
            priority: 0,
        })
        .collect();
    for chunk in batch.chunks(2000) {
        write(db, |tx| async move { ops::add_many(&tx, ks, T, chunk).await }).await.unwrap();
    }
    let mut handles = Vec::new();
    while handles.len() < n {
        let waiters = vec![worker.to_vec(); (n - handles.len()).min(1000)];
        let tokens = ops::new_tokens(waiters.len());
        let w = ops::Acceptors {
            workers: &waiters,
            incarnations: &[],
            tokens: &tokens,
            recheck: false,
            retries: 0,
            claims: None,
        };
        let round = write(db, |tx| async move { ops::accept(&tx, ks, T, w).await }).await;
        let before = handles.len();
        for take in round.takes {
            if let Take::Job(h) = take {
                handles.push(h);
            }
        }
        assert!(handles.len() > before, "each round takes jobs");
    }
    handles
}

async fn count(db: &Db, ks: &Keyspace) -> u64 {
    run(db.as_ref(), TxOptions::read(), |tx| async move { ops::pending_count(&tx, ks, T).await }).await.unwrap()
}

async fn keys(db: &Db, (b, e): (Vec<u8>, Vec<u8>)) -> usize {
    let r = RangeRequest::new(b, e);
    run(db.as_ref(), TxOptions::read(), |tx| {
        let r = r.clone();
        async move { tx.get_range(&r).await }
    })
    .await
    .unwrap()
    .len()
}

async fn update(db: &Db, ks: &Keyspace, fence: &Fence) -> Result<JobHandle, Error> {
    write(db, |tx| async move { ops::update(&tx, ks, fence, b"{}").await }).await
}

async fn a_worker_with_5000_running_jobs_is_requeued_in_bounded_batches(store: StoreKind) {
    let c = Cluster::on(store);
    let db = c.db();
    let ks = Keyspace::new(&db.prefix());
    let handles = setup_running(&db, &ks, b"w", 5000, 1000).await;
    assert_eq!(count(&db, &ks).await, 0);
    assert_eq!(keys(&db, ks.active_range(T, b"w")).await, 5000);

    // The removing transaction moves one batch and leaves a marker.
    let (moved, written) = remove_metered(&db, &ks, b"w").await;
    assert_eq!(moved, REQUEUE_MAX_JOBS);
    assert!(written < BATCH_WRITE_BUDGET + 100_000, "wrote {written} bytes");
    assert!(written < MAX_TRANSACTION_SIZE);
    assert_eq!(count(&db, &ks).await, REQUEUE_MAX_JOBS as u64);
    assert_eq!(keys(&db, ks.active_range(T, b"w")).await, 5000 - REQUEUE_MAX_JOBS);
    assert_eq!(keys(&db, ks.orphans_range()).await, 1);

    // Every old handle is refused at once, the requeued and the left over.
    let moved_one = &handles[0];
    let left_over = &handles[4999];
    assert_eq!(update(&db, &ks, &moved_one.fence()).await, Err(Error::NotOwner));
    assert_eq!(update(&db, &ks, &left_over.fence()).await, Err(Error::NotOwner));

    // The worker registers again and takes a job before the sweep: the
    // sweep leaves that one alone.
    let s = spec(T, b"w");
    let s = &s;
    let k = &ks;
    write(&db, |tx| async move { roster::register(&tx, k, s, &[10; 16], 0).await }).await;
    let again = vec![b"w".to_vec()];
    let tokens = ops::new_tokens(1);
    let a = ops::Acceptors {
        workers: &again,
        incarnations: &[],
        tokens: &tokens,
        recheck: false,
        retries: 0,
        claims: None,
    };
    let round = write(&db, |tx| async move { ops::accept(&tx, k, T, a).await }).await;
    let Take::Job(fresh) = round.takes[0].clone() else { panic!("a job") };
    assert_eq!(fresh.job.attempts, 2);
    update(&db, &ks, &fresh.fence()).await.expect("the new incarnation's handle works");

    // The sweep, in bounded steps.
    let mut cursor = None;
    let mut steps = 0;
    let mut total = 0;
    loop {
        let tx = db.create_transaction(&TxOptions::write()).await.unwrap();
        let metered = Arc::new(Hooked::new(tx, Meter::new(&ks)));
        let as_tx: Tx = metered.clone();
        let step = ops::sweep_orphan(&as_tx, &ks, T, b"w", cursor.as_ref()).await.unwrap();
        as_tx.commit().await.unwrap();
        assert!(metered.hooks().written.load(Ordering::SeqCst) < BATCH_WRITE_BUDGET + 100_000);
        steps += 1;
        match step {
            SweepStep::Done { moved } => {
                total += moved;
                break;
            }
            SweepStep::More { moved, cursor: c } => {
                assert!(moved <= REQUEUE_MAX_JOBS);
                total += moved;
                cursor = Some(c);
            }
        }
        assert!(steps < 100, "the sweep ends");
    }
    assert_eq!(total, 5000 - REQUEUE_MAX_JOBS);
    assert!(steps >= (5000 - REQUEUE_MAX_JOBS) / REQUEUE_MAX_JOBS);
    assert_eq!(keys(&db, ks.orphans_range()).await, 0, "marker cleared");
    assert_eq!(keys(&db, ks.active_range(T, b"w")).await, 1, "only the new incarnation's job");
    assert_eq!(count(&db, &ks).await, 4999);
    assert_eq!(keys(&db, ks.pending_range(T)).await, 4999);
    update(&db, &ks, &fresh.fence()).await.expect("still running for the new incarnation");
    assert_eq!(update(&db, &ks, &left_over.fence()).await, Err(Error::NotOwner));
    let job = run(db.as_ref(), TxOptions::read(), |tx| {
        let ks = ks.clone();
        async move { ops::get(&tx, &ks, T, b"j04999").await }
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!((job.state, job.attempts, job.worker), (JobState::Pending, 1, None));
    db.close();
}

async fn big_records_stop_a_batch_at_the_byte_budget_and_the_node_sweeper_finishes(store: StoreKind) {
    let c = Cluster::on(store);
    let db = c.db();
    let ks = Keyspace::new(&db.prefix());
    let n = 40;
    setup_running(&db, &ks, b"w", n, 85_000).await;
    let (moved, written) = remove_metered(&db, &ks, b"w").await;
    assert!(moved > 0 && moved < n, "moved {moved}");
    assert!(written <= BATCH_WRITE_BUDGET + 100_000, "wrote {written} bytes");
    assert_eq!(keys(&db, ks.orphans_range()).await, 1);
    // A node's sweeper (woken by the marker's watch key, or at start)
    // moves the rest.
    let node = c.node();
    let done =
        eventually(Duration::from_secs(10), || async { node.jobs().pending_count(T).await.unwrap() == n as u64 }).await;
    assert!(done, "the sweeper requeued every job");
    assert!(eventually(Duration::from_secs(2), || async { keys(&db, ks.orphans_range()).await == 0 }).await);
    assert_eq!(keys(&db, ks.active_range(T, b"w")).await, 0);
    assert_eq!(pending_keys(&node, T).await, n);
    node.stop().await;
    db.close();
}

async fn a_running_sweeper_is_woken_by_a_new_marker(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let db = c.db();
    let ks = Keyspace::new(&db.prefix());
    setup_running(&db, &ks, b"w", REQUEUE_MAX_JOBS + 50, 100).await;
    let (moved, _) = remove_metered(&db, &ks, b"w").await;
    assert_eq!(moved, REQUEUE_MAX_JOBS);
    // The periodic pass is 10 s away: only the watch can be this quick.
    let done = eventually(Duration::from_secs(5), || async {
        node.jobs().pending_count(T).await.unwrap() == (REQUEUE_MAX_JOBS + 50) as u64
    })
    .await;
    assert!(done, "pushed to the sweeper");
    assert!(eventually(Duration::from_secs(10), || async { keys(&db, ks.orphans_range()).await == 0 }).await);
    node.stop().await;
    db.close();
}

couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread"),
    stores: [embedded: Embedded],
    tests: [
        unregistered_worker_jobs_go_back_to_pending_and_its_handles_are_refused,
        removal_in_the_workers_transaction_and_by_the_reaper,
        a_running_sweeper_is_woken_by_a_new_marker,
        a_worker_with_5000_running_jobs_is_requeued_in_bounded_batches,
        big_records_stop_a_batch_at_the_byte_budget_and_the_node_sweeper_finishes,
    ],
);
