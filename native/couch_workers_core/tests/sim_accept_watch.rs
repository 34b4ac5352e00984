//! On the `sim` store: an accept round that leaves
//! waiters must not arm its `jobs_vs` watch inside its writing
//! transaction. On FoundationDB creating a watch reads the key without
//! `snapshot` (the sim models it: `tests/sim_store.rs`,
//! `a_watch_is_a_read_that_conflicts`), and every `job_add` writes
//! `jobs_vs`: each add that commits during a round would abort the round
//! (`not_committed`, 1020), although the add wrote only at the queue's
//! tail, past what the round read.
//!
//! Shape: more acceptors than one round serves (`ROUND_MAX_WAITERS`), so
//! every round leaves waiters and needs the watch; a queue far longer
//! than the rounds take, so their range reads never reach its tail; one
//! task appending jobs at the tail meanwhile. Nothing else in the window
//! writes what a round reads (the workers' timeout is ten minutes, so no
//! heartbeat falls in it), so the cluster's conflict count is the accept
//! rounds'.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use couch_workers_core::jobs::dispatcher::ROUND_MAX_WAITERS;
use couch_workers_core::jobs::NewJob;
use couch_workers_core::log::Discard;
use couch_workers_core::store::sim::{SimOptions, SimStore};
use couch_workers_core::store::Db;
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Error, Node, Settings};

const T: &[u8] = b"tail";
const QUEUED: usize = 3_000;
/// Jobs the workers take in all: half the queue, so it stays long.
const TAKE: usize = 1_500;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_at_the_tail_do_not_abort_accept_rounds() {
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    let sim = SimStore::new(SimOptions::new(seed));
    let db: Db = sim.clone();
    let node = Node::with_db(db, Settings::default(), Arc::new(Discard));
    let jobs = node.jobs().clone();
    let workers = 2 * ROUND_MAX_WAITERS + 50;
    let mut regs = Vec::new();
    for i in 0..workers {
        let spec = WorkerSpec {
            worker_type: T.to_vec(),
            id: format!("w{i}").into_bytes(),
            options_json: b"{}".to_vec(),
            timeout_s: 600,
        };
        regs.push(node.register_worker(spec).await.expect("register"));
    }
    for chunk in 0..QUEUED / 500 {
        let batch: Vec<NewJob> = (0..500)
            .map(|i| NewJob { id: format!("q{:05}", chunk * 500 + i).into_bytes(), info: b"{}".to_vec(), priority: 0 })
            .collect();
        jobs.add_many(T, &batch).await.expect("add_many");
    }
    let conflicts_before = sim.stats().conflicts;
    let stop = Arc::new(AtomicBool::new(false));
    let taken = Arc::new(AtomicUsize::new(0));
    let adder = {
        let (jobs, stop) = (jobs.clone(), stop.clone());
        tokio::spawn(async move {
            let mut added = 0usize;
            while !stop.load(Ordering::SeqCst) {
                jobs.add(T, format!("tail{added:06}").as_bytes(), b"{}", 0).await.expect("add at the tail");
                added += 1;
            }
            added
        })
    };
    // Accepts that found no job within their timeout although the queue
    // was long: rounds that kept conflicting starve their waiters.
    let starved = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..workers)
        .map(|i| {
            let (jobs, stop, taken, starved) = (jobs.clone(), stop.clone(), taken.clone(), starved.clone());
            tokio::spawn(async move {
                let worker = format!("w{i}").into_bytes();
                while !stop.load(Ordering::SeqCst) {
                    match jobs.accept(T, &worker, Duration::from_secs(10)).await {
                        Ok(handle) => {
                            jobs.finish(&handle.fence(), b"{}").await.expect("finish");
                            if taken.fetch_add(1, Ordering::SeqCst) + 1 >= TAKE {
                                stop.store(true, Ordering::SeqCst);
                            }
                        }
                        Err(Error::NotFound) => {
                            starved.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => panic!("accept: {e:?}"),
                    }
                }
            })
        })
        .collect();
    // A bound on the run only for the case that rounds livelock (before
    // the fix, with this many waiters): the figures are counts.
    let deadline = {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            stop.store(true, Ordering::SeqCst);
        })
    };
    for t in tasks {
        t.await.expect("worker task");
    }
    deadline.abort();
    let added = adder.await.expect("adder");
    let conflicts = sim.stats().conflicts - conflicts_before;
    let (taken, starved) = (taken.load(Ordering::SeqCst), starved.load(Ordering::SeqCst));
    eprintln!(
        "{taken} jobs taken by {workers} workers while {added} were added at the tail: {conflicts} conflicts, {starved} accepts starved"
    );
    assert_eq!(starved, 0, "{starved} accepts found no job in 10 s with the queue long");
    assert!(added >= 20, "only {added} adds ran during the rounds: the test did not test");
    let pending = jobs.pending_count(T).await.expect("count");
    assert!(pending as usize >= QUEUED - TAKE - workers, "the queue ran short ({pending} left): rounds read its tail");
    assert_eq!(conflicts, 0, "{conflicts} accept rounds aborted by adds at the queue's tail ({taken} jobs taken)");
    drop(regs);
    node.stop().await;
}
