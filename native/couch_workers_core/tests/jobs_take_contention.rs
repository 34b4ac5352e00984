//! Many takers on one queue, each in transactions of its own: the
//! `job_finish_accept/3` callers of a node, and the accept rounds of
//! several nodes' dispatchers. Two takers that read the same pending job
//! conflict and one retries; before, every retry read the queue's head
//! again, which the others kept taking, so one taker could lose every
//! race until its budget ended: on FoundationDB a `finish_accept` answered
//! `timeout`, and a node's round failed and its waiters got `not_found`
//! while jobs were pending. Every job must be taken exactly once, and no
//! taker may be answered an error or `not_found` while jobs wait.
//!
//! Also: a waiter alone in its round, whose worker id is too long for the
//! job at the head of the queue (the active key would be over the key
//! limit), is served the jobs behind it.

mod jobs_common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use couch_workers_core::jobs::ops::{self, Claimed, Claims, Take};
use couch_workers_core::jobs::{JobHandle, JobService, JobState, NewJob, NextFor};
use couch_workers_core::log::{Event, Sink};
use couch_workers_core::metrics::{StoreCounts, STORE};
use couch_workers_core::store::{run, TxOptions, MAX_KEY_SIZE};
use couch_workers_core::{Error, Node, Settings};
use jobs_common::*;

const T: &[u8] = b"contended";

/// Counts the accept rounds that failed (`job_accept_round_failed`: a
/// round out of its budget, its waiters left waiting).
#[derive(Default)]
struct RoundFailures(AtomicU64);

impl Sink for RoundFailures {
    fn log(&self, event: Event) {
        if event.what == "job_accept_round_failed" {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// What the takers saw, over all of them.
#[derive(Default)]
struct Seen {
    /// Every job id taken, in no order (a job twice is a defect).
    taken: Mutex<Vec<Vec<u8>>>,
    /// Errors answered to a taker (`timeout` before the fix).
    errors: Mutex<Vec<String>>,
    /// `not_found` from an accept while the queue still held jobs: no
    /// job is added during the drain and none goes back to pending, so
    /// the pending count read after the answer is a floor of what was
    /// pending when it came.
    not_found_while_pending: AtomicU64,
}

impl Seen {
    fn took(&self, h: &JobHandle) {
        self.taken.lock().unwrap().push(h.job.id.clone());
    }

    fn error(&self, what: &str, e: Error) {
        self.errors.lock().unwrap().push(format!("{what}: {e}"));
    }
}

fn job_id(i: usize) -> Vec<u8> {
    format!("j{i:05}").into_bytes()
}

async fn add_jobs(jobs: &JobService, n: usize) {
    let all: Vec<NewJob> = (0..n).map(|i| NewJob { id: job_id(i), info: b"{}".to_vec(), priority: 0 }).collect();
    for batch in all.chunks(500) {
        jobs.add_many(T, batch).await.expect("add_many");
    }
}

/// Takes a job with the dispatcher (timeout `wait`) until the queue is
/// empty; `None` when it is. A `not_found` while jobs are pending is
/// counted and the taker waits again.
async fn accept_until_empty(jobs: &JobService, worker: &[u8], wait: Duration, seen: &Seen) -> Option<JobHandle> {
    loop {
        match jobs.accept(T, worker, wait).await {
            Ok(h) => return Some(h),
            Err(Error::NotFound) => match jobs.pending_count(T).await {
                Ok(0) => return None,
                Ok(_) => {
                    seen.not_found_while_pending.fetch_add(1, Ordering::SeqCst);
                }
                Err(e) => {
                    seen.error("pending_count", e);
                    return None;
                }
            },
            Err(e) => {
                seen.error("accept", e);
                return None;
            }
        }
    }
}

/// A worker that finishes each job with `finish_accept`, which takes its
/// next job in the same transaction, and waits in the dispatcher only
/// when that took none.
async fn finish_accept_worker(jobs: JobService, worker: Vec<u8>, seen: Arc<Seen>) {
    let next = NextFor { worker_type: T, worker: &worker, incarnation: None };
    let mut held = accept_until_empty(&jobs, &worker, Duration::from_secs(3), &seen).await;
    while let Some(h) = held {
        seen.took(&h);
        held = match jobs.finish_accept(&h.fence(), b"{}", next).await {
            Ok(Some(h)) => Some(h),
            Ok(None) => accept_until_empty(&jobs, &worker, Duration::from_secs(3), &seen).await,
            Err(e) => {
                seen.error("finish_accept", e);
                None
            }
        };
    }
}

/// A worker that takes each job through the dispatcher's accept rounds
/// (timeout 3 s) and finishes it in a call of its own (bench J2's
/// worker).
async fn accept_worker(jobs: JobService, worker: Vec<u8>, seen: Arc<Seen>) {
    while let Some(h) = accept_until_empty(&jobs, &worker, Duration::from_secs(3), &seen).await {
        seen.took(&h);
        if let Err(e) = jobs.finish(&h.fence(), b"{}").await {
            seen.error("finish", e);
            return;
        }
    }
}

/// When a drain started, to print what it took (`--nocapture`).
struct Started {
    at: std::time::Instant,
    counts: StoreCounts,
}

impl Started {
    fn now() -> Self {
        Started { at: std::time::Instant::now(), counts: STORE.snapshot() }
    }

    /// The drain's time, and the store counters of the whole process while
    /// it ran (other tests of the binary add theirs: run it alone to read
    /// them as this drain's).
    fn print(&self, store: StoreKind, what: &str, n: usize) {
        let secs = self.at.elapsed().as_secs_f64();
        let now = STORE.snapshot();
        let (tx, conflicts) = (now.transactions - self.counts.transactions, now.conflicts - self.counts.conflicts);
        eprintln!(
            "{}: {what}: {n} jobs in {secs:.2} s ({:.0} jobs/s); process-wide meanwhile: {tx} transactions, \
             {conflicts} conflicts ({:.3} per job)",
            store.name(),
            n as f64 / secs,
            conflicts as f64 / n as f64
        );
    }
}

/// Every job taken exactly once and finished, none left pending, and no
/// taker answered an error or `not_found` while jobs waited.
async fn check_drained(jobs: &JobService, n: usize, seen: &Seen, failures: u64) {
    let errors = seen.errors.lock().unwrap().clone();
    assert!(errors.is_empty(), "takers answered errors: {errors:?}");
    assert_eq!(seen.not_found_while_pending.load(Ordering::SeqCst), 0, "not_found while jobs were pending");
    assert_eq!(failures, 0, "accept rounds failed (out of their budget)");
    let taken = seen.taken.lock().unwrap().clone();
    let unique: HashSet<&Vec<u8>> = taken.iter().collect();
    assert_eq!(unique.len(), taken.len(), "a job taken twice");
    assert_eq!(taken.len(), n, "every job taken");
    assert_eq!(jobs.pending_count(T).await, Ok(0));
    let counts = jobs.counts(T).await.expect("counts");
    assert!(counts.contains(&(JobState::Finished, n as u64)), "{counts:?}");
    assert!(counts.contains(&(JobState::Running, 0)), "{counts:?}");
}

/// Bench J2n's shape: 8 workers of one node drain one queue with
/// `finish_accept`, each call one transaction that takes the queue's
/// next job. Before, on FoundationDB one call lost the head to the other
/// seven until its budget ended and answered `timeout`.
async fn finish_accept_callers_on_one_queue_never_time_out(store: StoreKind) {
    const JOBS: usize = 4_000;
    const WORKERS: usize = 8;
    let c = Cluster::on(store);
    let failures = Arc::new(RoundFailures::default());
    let node = Node::with_db(c.db(), Settings::default(), failures.clone());
    add_jobs(node.jobs(), JOBS).await;
    let seen = Arc::new(Seen::default());
    let mut regs = Vec::new();
    let mut tasks = Vec::new();
    let started = Started::now();
    for w in 0..WORKERS {
        let worker = format!("w{w}").into_bytes();
        regs.push(register(&node, T, &worker).await);
        tasks.push(tokio::spawn(finish_accept_worker(node.jobs().clone(), worker, seen.clone())));
    }
    for t in tasks {
        t.await.expect("a worker task");
    }
    started.print(store, "8 finish_accept workers", JOBS);
    check_drained(node.jobs(), JOBS, &seen, failures.0.load(Ordering::SeqCst)).await;
    node.stop().await;
}

/// Bench J2x's shape, with J2n's workers beside: 4 nodes on one store,
/// each with 4 workers taking through its dispatcher's accept rounds and
/// 2 workers taking with `finish_accept`. Before, on FoundationDB a
/// node's round lost the head to the others' until its budget ended
/// (`job_accept_round_failed`) while its waiters got `not_found`.
async fn accept_rounds_of_several_nodes_never_time_out(store: StoreKind) {
    const JOBS: usize = 4_000;
    const NODES: usize = 4;
    let c = Cluster::on(store);
    let failures = Arc::new(RoundFailures::default());
    let nodes: Vec<Arc<Node>> =
        (0..NODES).map(|_| Node::with_db(c.db(), Settings::default(), failures.clone())).collect();
    add_jobs(nodes[0].jobs(), JOBS).await;
    let seen = Arc::new(Seen::default());
    let mut regs = Vec::new();
    let mut tasks = Vec::new();
    let started = Started::now();
    for (n, node) in nodes.iter().enumerate() {
        for w in 0..6 {
            let worker = format!("n{n}w{w}").into_bytes();
            regs.push(register(node, T, &worker).await);
            let (jobs, seen) = (node.jobs().clone(), seen.clone());
            tasks.push(if w < 4 {
                tokio::spawn(accept_worker(jobs, worker, seen))
            } else {
                tokio::spawn(finish_accept_worker(jobs, worker, seen))
            });
        }
    }
    for t in tasks {
        t.await.expect("a worker task");
    }
    started.print(store, "4 nodes, 4 accepting and 2 finish_accept workers each", JOBS);
    check_drained(nodes[0].jobs(), JOBS, &seen, failures.0.load(Ordering::SeqCst)).await;
    for node in nodes {
        node.stop().await;
    }
}

/// A waiter alone in its round, whose worker id is as long as the active
/// key of a job with a short id allows, and jobs at the head of the queue
/// whose ids are longer: it cannot hold those (its active key would be
/// over the key limit), and they stay pending for other workers. Before,
/// a round read only as many pending jobs as it had waiters, found none
/// it could give this one, and did not look further: `not_found` (timeout
/// 0 and with a wait) and `finish_accept` taking nothing while a job it
/// can hold waited behind them.
async fn a_lone_waiter_is_served_past_head_jobs_it_cannot_hold(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    // Ids long enough that the active key, not a key of the
    // registration, is what limits the ids of its workers.
    let id = |tail: &str| format!("a-job-whose-id-is-longer-than-the-keys-of-a-registration-{tail}").into_bytes();
    let short: Vec<Vec<u8>> = (1..=3).map(|i| id(&format!("{i}"))).collect();
    let long = vec![b'w'; MAX_KEY_SIZE - ks(&node).active(T, b"", &short[0]).len()];
    let longer_ids: Vec<Vec<u8>> = (0..20).map(|i| id(&format!("longer-{i:02}"))).collect();
    for id in &longer_ids {
        assert!(ks(&node).active(T, &long, id).len() > MAX_KEY_SIZE, "the long worker cannot hold {id:?}");
        add(jobs, T, id, 0).await;
    }
    for id in &short {
        assert!(ks(&node).active(T, &long, id).len() <= MAX_KEY_SIZE);
        add(jobs, T, id, 0).await;
    }
    let _long = register(&node, T, &long).await;

    let first = jobs.accept(T, &long, Duration::ZERO).await.expect("accept with timeout 0 takes a job behind them");
    assert_eq!(first.job.id, short[0]);
    let second = jobs
        .finish_accept(&first.fence(), b"{}", NextFor { worker_type: T, worker: &long, incarnation: None })
        .await
        .expect("finish_accept")
        .expect("finish_accept takes a job behind them");
    assert_eq!(second.job.id, short[1]);
    jobs.finish(&second.fence(), b"{}").await.expect("finish");
    let third = jobs.accept(T, &long, Duration::from_secs(5)).await.expect("a waiting accept takes a job behind them");
    assert_eq!(third.job.id, short[2]);
    jobs.finish(&third.fence(), b"{}").await.expect("finish");
    // Nothing it can hold is left: it waits, and the others stay pending.
    assert_eq!(jobs.accept(T, &long, Duration::from_millis(300)).await, Err(Error::NotFound));
    assert_eq!(jobs.pending_count(T).await, Ok(longer_ids.len() as u64));

    // A worker with a short id takes them, in queue order.
    let _w = register(&node, T, b"w").await;
    for id in &longer_ids {
        let h = accept_now(jobs, T, b"w").await;
        assert_eq!(&h.job.id, id);
        assert_eq!(h.job.state, JobState::Running);
        jobs.finish(&h.fence(), b"{}").await.expect("finish");
    }
    node.stop().await;
}

/// One accept round of worker `w` for one waiter, with `claims`: the id
/// of the job it took.
async fn take_one(node: &Node, claims: &Claimed<'_>) -> Vec<u8> {
    let (ks, waiters, tokens) = (ks(node), [b"w".to_vec()], ops::new_tokens(1));
    let (w, t) = (&waiters, &tokens);
    let round = run(node.db().as_ref(), TxOptions::write(), |tx| async move {
        let acceptors = ops::Acceptors {
            workers: w,
            incarnations: &[],
            tokens: t,
            recheck: false,
            retries: 0,
            claims: Some(claims),
        };
        ops::accept(&tx, ks, T, acceptors).await
    })
    .await
    .expect("an accept round");
    match &round.takes[0] {
        Take::Job(h) => h.job.id.clone(),
        other => panic!("no job taken: {other:?}"),
    }
}

/// A node's takes pass over the jobs its other takes claimed: they take
/// the next job of the same priority instead, and a claimed job still
/// comes before any job of a later priority (no priority inversion when
/// the take that claimed it fails).
async fn a_take_passes_over_jobs_other_takes_claimed_within_their_priority(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let _w = register(&node, T, b"w").await;
    for (id, priority) in [(&b"a"[..], 0), (b"b", 0), (b"c", 5)] {
        add(node.jobs(), T, id, priority).await;
    }
    let keys: Vec<Vec<u8>> = range(&node, ks(&node).pending_range(T)).await.into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys.len(), 3);
    let claims = Claims::default();
    let sibling = claims.holder(T);
    assert!(sibling.claim(&keys[0]), "a take in flight claims a");
    let mine = claims.holder(T);
    mine.begin_attempt();
    assert_eq!(take_one(&node, &mine).await, b"b", "the next job of a's priority, not a");
    drop(mine);
    let mine = claims.holder(T);
    mine.begin_attempt();
    assert_eq!(take_one(&node, &mine).await, b"a", "a, still claimed, before c of a later priority");
    drop(mine);
    let mine = claims.holder(T);
    mine.begin_attempt();
    assert_eq!(take_one(&node, &mine).await, b"c");
    assert_eq!(node.jobs().pending_count(T).await, Ok(0));
    node.stop().await;
}

couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread"),
    stores: [embedded: Embedded, sim: Sim],
    tests: [
        finish_accept_callers_on_one_queue_never_time_out,
        accept_rounds_of_several_nodes_never_time_out,
        a_lone_waiter_is_served_past_head_jobs_it_cannot_hold,
        a_take_passes_over_jobs_other_takes_claimed_within_their_priority,
    ],
);
