//! A cluster-shaped simulation on the sim store (a CI-sized one): several full `Node`s (dispatchers, reapers, sweepers,
//! heartbeats) on one simulated FoundationDB cluster with FDB-like
//! latencies, random recoveries and spurious watch fires, workers
//! accepting and finishing jobs, two nodes dying mid-run without a goodbye.
//!
//! Invariants, checked by counting at the end: every job finished, each
//! by exactly one successful `finish`; none lost; the pending count exact
//! (0); the key space consistent (`faults_common::Snapshot`); the
//! membership equal to the live nodes' workers; no worker of a live node
//! reaped, across recoveries. It prints conflicts per accepted job.
//!
//! The fault mix includes `commit_unknown_result` both ways (5% of
//! transactions, half of them after a commit that happened): every job
//! operation answers for its own landed write (receipts, `store::receipt`),
//! and an accept whose outcome stays unknown gives its job back.
//! Recoveries also make commits answer `commit_unknown_result`, after
//! commits that did not happen.
//!
//! Reproducible in its faults from a seed: `CW_SIM_SEED=<seed>` (printed
//! at the start and in every failure); the thread scheduling of a
//! multi-threaded run is not reproducible.

mod faults_common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use couch_workers_core::jobs::{JobState, NewJob};
use couch_workers_core::store::sim::{Latency, SimFaults, SimOptions, SimStore};
use couch_workers_core::store::{Db, StoreError};
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Error, Node, Registration, Settings};
use faults_common::*;

const T: &[u8] = b"indexer";
/// Nodes 0 and 1 die a while into the run.
const DYING: usize = 2;
const TIMEOUT_S: u64 = 1;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn seed() -> u64 {
    env_or("CW_SIM_SEED", rand::random())
}

/// The cluster's size: CI-sized by default; `CW_SIM_NODES`,
/// `CW_SIM_WORKERS` (per node) and `CW_SIM_JOBS` make the long run.
struct Shape {
    nodes: usize,
    workers: usize,
    jobs: usize,
}

impl Shape {
    fn from_env() -> Self {
        let shape = Shape {
            nodes: env_or("CW_SIM_NODES", 6),
            workers: env_or("CW_SIM_WORKERS", 3),
            jobs: env_or("CW_SIM_JOBS", 300),
        };
        assert!(shape.nodes > DYING, "CW_SIM_NODES must be more than the {DYING} nodes that die");
        shape
    }

    /// The whole run must be done by then: 40 s, and 20 ms more per job.
    fn deadline(&self) -> Duration {
        Duration::from_secs(40) + Duration::from_millis(20) * self.jobs as u32
    }
}

fn worker_id(node: usize, w: usize) -> Vec<u8> {
    format!("n{node}-w{w}").into_bytes()
}

#[derive(Default)]
struct Tally {
    /// Successful finishes per job id.
    finished: BTreeMap<Vec<u8>, usize>,
    accepted: usize,
    /// `finish` answered `not_owner`: the job was taken away (its worker's
    /// node died, or it was reaped).
    lost_ownership: usize,
    /// `accept` answered `commit_unknown_result` (no retry left).
    unknown_accepts: usize,
}

async fn worker_loop(
    node: Arc<Node>,
    id: Vec<u8>,
    jobs_total: usize,
    tally: Arc<Mutex<Tally>>,
    done: Arc<tokio::sync::Notify>,
    quit: Arc<AtomicBool>,
) {
    let jobs = node.jobs().clone();
    loop {
        if node.is_stopped() || quit.load(Ordering::Acquire) {
            return;
        }
        match jobs.accept(T, &id, Duration::from_millis(300)).await {
            Ok(handle) => {
                tally.lock().unwrap().accepted += 1;
                // The work: long enough that the dying nodes hold jobs
                // when they die.
                tokio::time::sleep(Duration::from_millis(rand::random_range(5..60))).await;
                match jobs.finish(&handle.fence(), b"{\"ok\":true}").await {
                    Ok(()) => {
                        let mut t = tally.lock().unwrap();
                        *t.finished.entry(handle.job.id.clone()).or_default() += 1;
                        if t.finished.len() == jobs_total {
                            done.notify_waiters();
                        }
                    }
                    Err(Error::NotOwner) => tally.lock().unwrap().lost_ownership += 1,
                    Err(e) if node.is_stopped() => {
                        let _ = e;
                        return;
                    }
                    Err(e) => panic!("finish of {:?}: {e}", String::from_utf8_lossy(&handle.job.id)),
                }
            }
            Err(Error::NotFound) => {} // no job within the timeout
            // Out of retries after an unknown commit: the job it may have
            // taken goes back to pending (`ServiceState::reclaim`).
            Err(Error::Store(StoreError::CommitUnknown)) => tally.lock().unwrap().unknown_accepts += 1,
            Err(_) if node.is_stopped() => return,
            Err(e) => panic!("accept by {:?}: {e}", String::from_utf8_lossy(&id)),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_cluster_on_the_sim_store_loses_no_job_and_reaps_no_live_worker() {
    count_panics();
    let seed = seed();
    let shape = Shape::from_env();
    let (nodes_n, workers_n, jobs_n) = (shape.nodes, shape.workers, shape.jobs);
    eprintln!("sim cluster: {nodes_n} nodes x {workers_n} workers, {jobs_n} jobs, seed {seed} (rerun with CW_SIM_SEED={seed})");
    let faults = SimFaults {
        commit_unknown: 0.05,
        recovery: 0.002,
        spurious_watch: 0.01,
        commit_latency: Latency::between(Duration::from_micros(1_500), Duration::from_micros(2_500)),
        ..SimFaults::fdb_like_latencies()
    };
    let cluster = SimStore::new(SimOptions::new(seed).faults(faults));
    let settings = Settings { reaper_max_interval: Duration::from_millis(250), ..Settings::default() };
    let mut nodes = Vec::new();
    let mut logs = Vec::new();
    for _ in 0..nodes_n {
        let log = CaptureLog::new();
        nodes.push(Node::with_db(cluster.connect() as Db, settings, log.clone()));
        logs.push(log);
    }
    let mut regs: Vec<Vec<Registration>> = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        let mut mine = Vec::new();
        for w in 0..workers_n {
            let spec = WorkerSpec {
                worker_type: T.to_vec(),
                id: worker_id(n, w),
                options_json: b"{}".to_vec(),
                timeout_s: TIMEOUT_S,
            };
            mine.push(node.register_worker(spec).await.unwrap_or_else(|e| panic!("seed {seed}: register: {e}")));
        }
        regs.push(mine);
    }
    let tally = Arc::new(Mutex::new(Tally::default()));
    let done = Arc::new(tokio::sync::Notify::new());
    // Ends the worker loops once every job is done, so that the end state
    // is read from a quiet cluster.
    let quit = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        for w in 0..workers_n {
            tasks.push(tokio::spawn(worker_loop(
                node.clone(),
                worker_id(n, w),
                jobs_n,
                tally.clone(),
                done.clone(),
                quit.clone(),
            )));
        }
    }
    let started = Instant::now();
    // Jobs come from every node, in batches of up to BATCH (one
    // `add_many` each, which makes a backlog); singles in between.
    const BATCH: usize = 20;
    let mut next = 0;
    let mut died = false;
    while next < jobs_n {
        let n = (next / BATCH) % nodes_n;
        let node = if nodes[n].is_stopped() { &nodes[DYING + n % (nodes_n - DYING)] } else { &nodes[n] };
        let end = (next + BATCH).min(jobs_n);
        let batch: Vec<NewJob> = (next..end)
            .map(|i| NewJob { id: format!("job-{i:05}").into_bytes(), info: b"{}".to_vec(), priority: (i % 3) as i64 })
            .collect();
        node.jobs().add_many(T, &batch).await.unwrap_or_else(|e| panic!("seed {seed}: add jobs {next}..{end}: {e:?}"));
        next = end;
        if !died && next >= jobs_n / 3 {
            // Two nodes die without a goodbye while their workers hold
            // jobs: those go back to the queue once a reaper removes the
            // workers.
            died = true;
            for node in &nodes[..DYING] {
                node.stop().await;
            }
        }
    }
    let finished_all = loop {
        let notified = done.notified();
        if tally.lock().unwrap().finished.len() == jobs_n {
            break true;
        }
        if started.elapsed() > shape.deadline() {
            break false;
        }
        let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
    };
    let stats = cluster.stats();
    let (accepted, lost, finished, unknown_accepts) = {
        let t = tally.lock().unwrap();
        (t.accepted, t.lost_ownership, t.finished.clone(), t.unknown_accepts)
    };
    eprintln!(
        "sim cluster (seed {seed}): {} of {jobs_n} jobs finished in {:?}; {accepted} accepts, {lost} finishes refused \
         (not_owner); {unknown_accepts} accepts answered commit_unknown_result; {:.2} conflicts per accepted job; {stats:?}",
        finished.len(),
        started.elapsed(),
        stats.conflicts as f64 / accepted.max(1) as f64,
    );
    if !finished_all {
        // Say where the missing jobs are, from the store.
        let live = &nodes[DYING];
        let snap = snapshot(live.db().as_ref(), live.keyspace()).await;
        let missing: Vec<String> = (0..jobs_n)
            .map(|i| format!("job-{i:05}"))
            .filter(|id| !finished.contains_key(id.as_bytes()))
            .take(20)
            .map(|id| format!("{id}: {:?}", snap.record(T, id.as_bytes())))
            .collect();
        // A worker task that panicked holds its job for good: say so.
        eprintln!(
            "sim cluster (seed {seed}): states {:?}; members {:?}; violations {:?}; panics in tasks {}; unfinished: {missing:#?}",
            snap.states(T),
            snap.members_of(T).len(),
            snap.violations(),
            panics()
        );
    }
    assert!(
        finished_all,
        "seed {seed}: only {} of {jobs_n} jobs finished within {:?}",
        finished.len(),
        shape.deadline()
    );
    let twice: Vec<_> = finished.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "seed {seed}: jobs finished more than once: {twice:?}");
    quit.store(true, Ordering::Release);
    for task in tasks {
        task.await.unwrap_or_else(|e| panic!("seed {seed}: a worker task panicked: {e}"));
    }

    // The live nodes' view of the end state: the API for one job and the
    // count, the whole key space in one snapshot for the rest.
    let live = &nodes[DYING];
    let first = live.jobs().get(T, b"job-00000").await.unwrap_or_else(|e| panic!("seed {seed}: job 0: {e}"));
    assert_eq!(first.state, JobState::Finished, "seed {seed}: job 0");
    assert_eq!(live.jobs().pending_count(T).await.expect("count"), 0, "seed {seed}");
    let snap = snapshot(live.db().as_ref(), live.keyspace()).await;
    let states = snap.states(T);
    assert_eq!(states, BTreeMap::from([("finished".to_string(), jobs_n)]), "seed {seed}: every job finished");
    let retried = (0..jobs_n)
        .filter(|i| snap.record(T, format!("job-{i:05}").as_bytes()).is_some_and(|r| r.attempts > 1))
        .count();
    eprintln!("sim cluster (seed {seed}): {retried} jobs ran again after their worker's node died");
    let expected: BTreeSet<Vec<u8>> =
        (DYING..nodes_n).flat_map(|n| (0..workers_n).map(move |w| worker_id(n, w))).collect();
    // The dead nodes' workers leave within their timeout (+ a reaper pass).
    let settle = Instant::now();
    let members = loop {
        let snap = snapshot(live.db().as_ref(), live.keyspace()).await;
        let members = snap.members_of(T);
        if members == expected || settle.elapsed() > Duration::from_secs(5) {
            snap.assert_ok(&format!("seed {seed}: at the end"));
            break members;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(members, expected, "seed {seed}: membership == the live nodes' workers");
    // No live worker was ever reaped (the dead ones may be, once each).
    let reaped: Vec<Vec<u8>> = logs
        .iter()
        .flat_map(|l| l.named("worker_reaped"))
        .filter_map(|e| field(&e, "id").map(String::into_bytes))
        .collect();
    let live_reaped: Vec<_> = reaped.iter().filter(|id| expected.contains(*id)).collect();
    assert!(live_reaped.is_empty(), "seed {seed}: live workers reaped: {live_reaped:?}");
    // Each dead worker is reaped at most once (the membership check above
    // shows every one of them gone). Not exactly once in the log: a reap
    // whose commit landed but was answered `commit_unknown_result` is
    // retried, finds the worker gone and logs nothing (the reaper's
    // removal has no receipt yet).
    let distinct: BTreeSet<&Vec<u8>> = reaped.iter().collect();
    assert_eq!(distinct.len(), reaped.len(), "seed {seed}: a worker reaped twice: {reaped:?}");
    assert!(reaped.len() <= DYING * workers_n, "seed {seed}: more reaps than dead workers: {reaped:?}");

    for node in &nodes[DYING..] {
        node.stop().await;
    }
    drop(regs);
    assert_eq!(panics(), 0, "seed {seed}: no panic in any background task");
}
