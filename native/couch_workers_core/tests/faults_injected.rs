//! Injected store faults at random points (`store::faulty`), under the
//! whole node: concurrent tasks register, unregister and drop workers,
//! add, accept, update, finish, cancel and remove jobs, read, subscribe and
//! watch the membership, while the store fails at random (conflicts, busy,
//! too old, commit-unknown with and without the commit, I/O errors; watches
//! that fire early or fail). Heartbeats, the reaper, dispatchers, watchers
//! and the sweeper run on the same faulty store.
//!
//! During the run every call must answer within [`CALL_LIMIT`] (no hang)
//! with success or one of the errors a caller can act on: an expected
//! outcome (`not_found`, `already_exists`, `not_owner`, `canceled`) or a
//! store failure that is not retryable or whose retry budget ran out
//! (`retry_limit`, `timeout`, the injected `store_io`). A bare retryable
//! error (`conflict`, `busy`, ...) must never leak, nor any `invalid`
//! (a corrupt record, a finished transaction reused), nor any panic,
//! background tasks included.
//!
//! Then faults are switched off and, without restarting anything:
//! membership converges to the live registrations; the key space's
//! invariants hold (see `faults_common::Snapshot::violations`); no job that
//! was added is lost, none is duplicated, none finished twice; every held
//! handle can finish; unregistering every worker sends every running job
//! (also "ghost" ones, below) back to pending; a fresh worker drains the
//! queue, each job finished exactly once; the node stops with no task
//! left.
//!
//! Seeds are fixed (override with `CW_FAULT_SEED`); with several tasks
//! sharing the RNG the run repeats its rates and kinds, not each draw.

mod faults_common;
// A test crate's root finds its modules beside it: these are in
// `faults_injected/`.
#[path = "faults_injected/step.rs"]
mod step;
#[path = "faults_injected/world.rs"]
mod world;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use couch_workers_core::jobs::{AddManyError, JobHandle, JobService, JobSubscription, NewJob};
use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::faulty::{FaultPlan, FaultStats, FaultyStore};
use couch_workers_core::store::{Db, StoreError};
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Error, MembershipWatch, Node, Registration, Settings};
use faults_common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use step::step;
use world::*;

const T: &[u8] = b"replicator";

/// Longest any single call may take before it counts as a hang.
const CALL_LIMIT: Duration = Duration::from_secs(10);

/// Health timeout of the workers: short, so that workers whose removal
/// failed (and so lost their heartbeat) are reaped quickly.
const WORKER_TIMEOUT_S: u64 = 2;

struct Scenario {
    name: &'static str,
    plan: FaultPlan,
    settings: Settings,
    tasks: usize,
    /// How long the tasks run with faults on.
    run_for: Duration,
}

async fn scenario(s: Scenario) {
    count_panics();
    let seed = std::env::var("CW_FAULT_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(s.plan.seed);
    let plan = FaultPlan { seed, ..s.plan.clone() };
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open the store");
    let inner: Db = store.clone();
    let faulty = FaultyStore::wrap(inner.clone(), plan);
    let log = CaptureLog::new();
    let node = Node::with_db(faulty.clone(), s.settings, log.clone());
    let world = Arc::new(Mutex::new(World::default()));

    // ---- faults on: random operations from several tasks -------------
    let deadline = Instant::now() + s.run_for;
    let tasks: Vec<_> = (0..s.tasks)
        .map(|t| {
            let (node, world) = (node.clone(), world.clone());
            tokio::spawn(async move {
                let jobs = node.jobs().clone();
                let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(1000).wrapping_add(t as u64));
                while Instant::now() < deadline {
                    step(&node, &jobs, &world, &mut rng).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a task of random operations panicked");
    }
    let faults: FaultStats = faulty.stats();
    faulty.set_enabled(false);
    let fault_phase = started.elapsed();

    // ---- faults off: everything settles without a restart ------------
    {
        let mut w = lock(&world);
        w.watches.clear();
        w.subscriptions.clear();
    }
    // Membership converges to the live registrations: workers whose
    // removal failed are reaped, reaped live ones are reinstated.
    let live = live_ids(&world);
    let settle = Instant::now();
    let mut members = BTreeSet::new();
    while settle.elapsed() < Duration::from_secs(4) {
        members = snapshot(inner.as_ref(), node.keyspace()).await.members_of(T);
        if members == live {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(members, live, "membership == the registered set, {:?} after the faults stopped", settle.elapsed());
    let settled_in = settle.elapsed();

    let snap = snapshot(inner.as_ref(), node.keyspace()).await;
    snap.assert_ok("after the faults stopped");

    // Nothing lost, nothing duplicated, nothing finished twice.
    let (handles, own_write_already_exists) = {
        let w = lock(&world);
        assert!(w.bad.is_empty(), "answers no caller should see:\n  {}", w.bad.join("\n  "));
        for (id, m) in &w.jobs {
            let name = String::from_utf8_lossy(id);
            let rec = snap.record(T, id);
            if m.added == Known::Yes && m.removed == Known::No {
                assert!(rec.is_some(), "job {name} was added and never removed, but is gone");
            }
            if m.removed == Known::Yes {
                assert!(rec.is_none(), "job {name} was removed but is there");
            }
            if m.added == Known::No {
                assert!(rec.is_none(), "job {name} was never added but is there");
            }
            assert!(m.finished_ok <= 1, "job {name} finished {} times", m.finished_ok);
            if let Some(rec) = rec {
                if m.finished_ok == 1 {
                    assert_eq!(rec.state, "finished", "job {name} was finished");
                }
                assert!(
                    rec.attempts >= m.accepted as i64,
                    "job {name}: {} accepts handed out, attempts {}",
                    m.accepted,
                    rec.attempts
                );
            }
        }
        for (t, id) in snap.jobs.keys() {
            assert!(t == T && w.jobs.contains_key(id), "a job nobody added: {}", String::from_utf8_lossy(id));
        }
        if w.own_write_already_exists > 0 {
            assert!(faults.unknown_committed > 0, "already_exists for a fresh id without any commit-unknown");
        }
        (w.handles.clone(), w.own_write_already_exists)
    };

    // Ghost accepts: running jobs that no handle holds (an accept whose
    // commit-unknown retry took another job). They belong to a live
    // worker and go back to pending when it goes.
    // (A retried round reuses its tokens: a ghost can carry the token of a
    // handle that holds another job, so jobs are matched by id and token.)
    let held: BTreeSet<(Vec<u8>, Vec<u8>)> = handles.iter().map(|h| (h.job.id.clone(), h.token.to_vec())).collect();
    let running: Vec<_> = snap
        .jobs
        .iter()
        .filter_map(|(k, r)| r.as_ref().ok().filter(|r| r.state == "running").map(|r| (k, r)))
        .collect();
    let ghosts = running
        .iter()
        .filter(|((_, id), r)| !r.token.as_ref().is_some_and(|t| held.contains(&(id.clone(), t.clone()))))
        .count();

    // Every handle that still holds its job finishes, faults off.
    let jobs = node.jobs().clone();
    let mut finished_by_handles = 0;
    for h in &handles {
        let holds =
            snap.record(T, &h.job.id).is_some_and(|r| r.state == "running" && r.token.as_deref() == Some(&h.token[..]));
        let r = call("finish after", jobs.finish(&h.fence(), b"{}")).await;
        if holds {
            assert_eq!(r, Ok(()), "a handle that holds its job finishes once the faults stop");
            finished_by_handles += 1;
            lock(&world).jobs.entry(h.job.id.clone()).or_default().finished_ok += 1;
        } else {
            assert!(matches!(r, Err(Error::NotOwner | Error::NotFound)), "{r:?}");
        }
    }

    // Every worker goes: every running job (ghosts too) back to pending.
    let regs: Vec<_> = lock(&world).workers.drain(..).collect();
    for (_, reg) in &regs {
        call("unregister after", node.unregister_worker(reg)).await.expect("unregister with faults off");
    }
    drop(regs);
    let snap = snapshot(inner.as_ref(), node.keyspace()).await;
    snap.assert_ok("after every worker left");
    assert!(snap.members_of(T).is_empty());
    let states = snap.states(T);
    assert_eq!(states.get("running"), None, "no running job without a worker: {states:?}");
    let pending = states.get("pending").copied().unwrap_or(0);
    assert_eq!(call("count", jobs.pending_count(T)).await, Ok(pending as u64));

    // A fresh worker drains the queue: each pending job exactly once.
    let drainer = call("register", node.register_worker(spec(b"drainer"))).await.expect("register");
    let mut drained = BTreeSet::new();
    loop {
        match call("drain accept", jobs.accept(T, b"drainer", Duration::ZERO)).await {
            Ok(h) => {
                assert!(drained.insert(h.job.id.clone()), "job taken twice");
                call("drain finish", jobs.finish(&h.fence(), b"{}")).await.expect("finish");
                let mut w = lock(&world);
                let m = w.jobs.entry(h.job.id.clone()).or_default();
                m.finished_ok += 1;
                assert_eq!(m.finished_ok, 1, "a job finished twice");
            }
            Err(Error::NotFound) => break,
            Err(e) => panic!("drain: {e:?}"),
        }
    }
    assert_eq!(drained.len(), pending, "the drain took every pending job");
    call("unregister", node.unregister_worker(&drainer)).await.expect("unregister");
    drop(drainer);
    let snap = snapshot(inner.as_ref(), node.keyspace()).await;
    snap.assert_ok("after the drain");
    let states = snap.states(T);
    assert!(states.keys().all(|s| s == "finished" || s == "canceled"), "{states:?}");

    // Nothing left running.
    node.stop().await;
    let stats = node.stats();
    assert_eq!((stats.heartbeats, stats.watchers, stats.reapers), (0, 0, 0), "{stats:?}");
    let js = node.jobs().stats();
    assert_eq!((js.dispatchers, js.job_watchers, js.sweepers, js.waiters), (0, 0, 0, 0), "{js:?}");
    assert_eq!(panics(), 0, "no panic in any background task");

    let w = lock(&world);
    eprintln!(
        "{} (seed {seed}): {} calls in {:.1?} by {} tasks, {} faults injected \
         (create {}, read {}, write {}, commit {}, watch {}; conflict {}, busy {}, too_old {}, \
         commit_unknown committed {} / not committed {}, io {}, spurious watch fires {})",
        s.name,
        w.calls,
        fault_phase,
        s.tasks,
        faults.total(),
        faults.at_create,
        faults.at_read,
        faults.at_write,
        faults.at_commit,
        faults.at_watch,
        faults.conflict,
        faults.busy,
        faults.too_old,
        faults.unknown_committed,
        faults.unknown_not_committed,
        faults.io,
        faults.watch_spurious,
    );
    eprintln!("{}: outcomes {:?}", s.name, w.outcomes);
    eprintln!(
        "{}: jobs {} ({} drained at the end), already_exists for its own write {}, ghost accepts {}, \
         held handles finished {}, membership settled in {:?}, heartbeat_failed logged {}, \
         worker_reaped {}, worker_reinstated {}, total {:.1?}",
        s.name,
        w.jobs.len(),
        drained.len(),
        own_write_already_exists,
        ghosts,
        finished_by_handles,
        settled_in,
        log.count("heartbeat_failed"),
        log.count("worker_reaped"),
        log.count("worker_reinstated"),
        started.elapsed(),
    );
    assert!(faults.total() > 100, "faults were injected: {faults:?}");
}

fn settings(tx_timeout_ms: u64, retry_limit: u32) -> Settings {
    Settings {
        tx_timeout: Duration::from_millis(tx_timeout_ms),
        tx_retry_limit: retry_limit,
        reaper_max_interval: Duration::from_millis(200),
    }
}

/// Retryable faults only, at a rate where most calls succeed after a few
/// retries: every call answers ok or an expected outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_faults_at_random_points() {
    scenario(Scenario {
        name: "retryable",
        plan: FaultPlan::retryable(11, 0.03),
        settings: settings(1_000, 100),
        tasks: 4,
        run_for: Duration::from_millis(1_200),
    })
    .await;
}

/// A fifth of the faults are I/O errors (not retried: the caller gets
/// `store_io` at once), the rest retryable, and commit-unknown always
/// after the commit happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_and_commit_unknown_faults() {
    let mut plan = FaultPlan::retryable(22, 0.03).with_io(0.2);
    plan.commit = 0.1;
    plan.unknown_committed_share = 1.0;
    scenario(Scenario {
        name: "io+unknown",
        plan,
        settings: settings(1_000, 100),
        tasks: 4,
        run_for: Duration::from_millis(1_200),
    })
    .await;
}

/// Faults so frequent, and a retry budget so small, that many calls run
/// out of it (`retry_limit`, `timeout`): still no hang, no corruption.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_faults_exhaust_the_retry_budget() {
    scenario(Scenario {
        name: "heavy",
        plan: FaultPlan::retryable(33, 0.12).with_io(0.05),
        settings: settings(300, 6),
        tasks: 4,
        run_for: Duration::from_millis(1_200),
    })
    .await;
}

/// Accepts whose commit is reported unknown although it happened: the
/// retry must hand out the job that commit took, not take a second one
/// that would then run for a worker that never heard of it ("ghost").
/// Half of all commits fail, a quarter of those as committed-but-unknown;
/// nothing else fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_retried_after_an_unknown_commit_take_no_second_job() {
    count_panics();
    let dir = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open the store");
    let inner: Db = store.clone();
    let plan = FaultPlan {
        seed: 44,
        create: 0.0,
        read: 0.0,
        write: 0.0,
        commit: 0.5,
        watch: 0.0,
        io_share: 0.0,
        unknown_committed_share: 1.0,
        enabled: false,
    };
    let faulty = FaultyStore::wrap(inner.clone(), plan);
    let node = Node::with_db(faulty.clone(), settings(5_000, 200), CaptureLog::new());
    let jobs = node.jobs().clone();
    let _reg = node.register_worker(spec(b"w")).await.expect("register");
    let new_jobs: Vec<NewJob> =
        (0..400).map(|i| NewJob { id: format!("j{i:03}").into_bytes(), info: b"{}".to_vec(), priority: 0 }).collect();
    jobs.add_many(T, &new_jobs).await.expect("add");

    faulty.set_enabled(true);
    let mut handles: Vec<JobHandle> = Vec::new();
    for i in 0..200 {
        // Both paths: one transaction (timeout 0) and the dispatcher.
        let timeout = if i % 2 == 0 { Duration::ZERO } else { Duration::from_secs(2) };
        handles.push(jobs.accept(T, b"w", timeout).await.expect("accept"));
    }
    faulty.set_enabled(false);
    let unknown = faulty.stats().unknown_committed;
    assert!(unknown >= 10, "too few committed-but-unknown commits to tell: {unknown}");

    // A retried round reuses its tokens: jobs are matched by id and token.
    let held: BTreeSet<(Vec<u8>, Vec<u8>)> = handles.iter().map(|h| (h.job.id.clone(), h.token.to_vec())).collect();
    assert_eq!(held.len(), 200, "each accept its own job");
    let snap = snapshot(inner.as_ref(), node.keyspace()).await;
    snap.assert_ok("after the accepts");
    let running: Vec<_> = snap
        .jobs
        .iter()
        .filter_map(|((_, id), r)| r.as_ref().ok().filter(|r| r.state == "running").map(|r| (id, r)))
        .collect();
    let ghosts = running
        .iter()
        .filter(|(id, r)| !r.token.as_ref().is_some_and(|t| held.contains(&((*id).clone(), t.clone()))))
        .count();
    assert_eq!(ghosts, 0, "jobs running for the worker under no handle it got ({unknown} unknown commits)");
    assert_eq!(running.len(), 200, "every handle holds a running job");
    for h in &handles {
        let rec = snap.record(T, &h.job.id).expect("the handle's job");
        assert_eq!(rec.token.as_deref(), Some(&h.token[..]), "the handle holds its job");
        assert_eq!(rec.vs, h.job.vs.to_vec(), "the handle's vs is its job's");
    }
    node.stop().await;
    assert_eq!(panics(), 0);
}
