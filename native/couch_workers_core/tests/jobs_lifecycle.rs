//! The job lifecycle in the core, on the embedded store:
//! every call of the newer contract in a randomized mix from two nodes,
//! then the whole key space checked (each state's counter equals its
//! records, each state's index lists exactly its records, scheduled and
//! expiry keys match their records, type counts match) and `counts`
//! compared with the records; the backoff's bounds; a scheduled job moved
//! to pending only once it is due.

mod faults_common;
mod jobs_common;

use std::collections::BTreeMap;
use std::time::Duration;

use couch_workers_core::jobs::{JobHandle, JobOpts, JobService, JobState, Keep, MaxAttempts, Retry, Schedule};
use couch_workers_core::store::Db;
use couch_workers_core::Error;
use faults_common::snapshot;
use jobs_common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const T: &[u8] = b"mix";

fn opts(rng: &mut StdRng) -> JobOpts {
    JobOpts {
        priority: rng.random_bool(0.5).then(|| rng.random_range(-2..3)),
        schedule: match rng.random_range(0..4) {
            0 => Some(Schedule::Delay(rng.random_range(0..40))),
            1 => Some(Schedule::RunAt(couch_workers_core::jobs::wall_ms() + rng.random_range(0..40))),
            _ => None,
        },
        max_attempts: match rng.random_range(0..4) {
            0 => Some(MaxAttempts::Infinity),
            1 => Some(MaxAttempts::Limit(rng.random_range(1..3))),
            _ => None,
        },
        keep: match rng.random_range(0..4) {
            0 => Some(Keep::Seconds(0)),
            1 => Some(Keep::Infinity),
            _ => None,
        },
        // Unique keys: tests/jobs_unique.rs.
        unique: None,
        // A group changes nothing without a per-group limit.
        group: rng.random_bool(0.3).then(|| b"g".to_vec()),
        // Activity timeouts take jobs back: tests/jobs_activity.rs.
        activity_timeout: None,
    }
}

/// Errors a random call may meet and that are not a bug.
fn expected(e: &Error) -> bool {
    matches!(e, Error::NotFound | Error::NotOwner | Error::AlreadyExists | Error::Canceled | Error::Changed)
}

fn check<T>(what: &str, r: Result<T, Error>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) if expected(&e) => None,
        Err(e) => panic!("{what}: {e:?}"),
    }
}

async fn step(jobs: &JobService, held: &mut Vec<JobHandle>, worker: &[u8], rng: &mut StdRng) {
    let id = format!("j{}", rng.random_range(0..40)).into_bytes();
    let info = info(rng.random_range(0..9));
    match rng.random_range(0..13) {
        0 | 1 => {
            check("add", jobs.add_with(T, &id, &info, &opts(rng)).await);
        }
        2 | 3 => {
            if let Some(h) =
                check("accept", jobs.accept(T, worker, Duration::from_millis(rng.random_range(0..30))).await)
            {
                held.push(h);
            }
        }
        4 if !held.is_empty() => {
            let h = held.swap_remove(rng.random_range(0..held.len()));
            check("finish", jobs.finish(&h.fence(), b"{}").await);
        }
        5 if !held.is_empty() => {
            let h = held.swap_remove(rng.random_range(0..held.len()));
            let retry = match rng.random_range(0..3) {
                0 => Retry::No,
                1 => Retry::After(rng.random_range(0..30)),
                _ => Retry::Backoff { base_ms: 5, max_ms: 20 },
            };
            check("fail", jobs.fail(&h.fence(), br#"{"e":1}"#, retry).await);
        }
        6 if !held.is_empty() => {
            let h = held.swap_remove(rng.random_range(0..held.len()));
            let o = opts(rng);
            let info = rng.random_bool(0.5).then_some(info);
            check("release", jobs.release(&h.fence(), &o, info.as_deref()).await);
        }
        7 if !held.is_empty() => {
            let i = rng.random_range(0..held.len());
            if let Some(h) = check("update", jobs.update(&held[i].fence(), &info).await) {
                held[i] = h;
            }
        }
        8 => {
            let if_vs = if rng.random_bool(0.3) { jobs.get(T, &id).await.ok().map(|j| j.vs) } else { None };
            check("resubmit", jobs.resubmit(T, &id, &info, &opts(rng), if_vs.as_ref()).await);
        }
        9 => {
            check("cancel", jobs.cancel(T, &id).await);
        }
        10 => {
            let if_vs = if rng.random_bool(0.5) { jobs.get(T, &id).await.ok().map(|j| j.vs) } else { None };
            check("remove", jobs.remove_if(T, &id, if_vs.as_ref()).await);
        }
        11 => {
            check("pause", jobs.set_paused(T, rng.random_bool(0.3)).await);
        }
        _ => {
            let page = check("list", jobs.list(T, Some(&[JobState::Pending, JobState::Failed]), 7, None).await);
            if let Some((jobs, _)) = page {
                assert!(jobs.iter().all(|j| matches!(j.state, JobState::Pending | JobState::Failed)));
            }
        }
    }
}

/// The records' states as the API counts them (due scheduled jobs count
/// as pending, as the records' run_at says).
fn states_of(snap: &faults_common::Snapshot) -> BTreeMap<String, u64> {
    let now = couch_workers_core::jobs::wall_ms() as i64;
    let mut by_state = BTreeMap::new();
    for rec in snap.jobs.values().flatten() {
        let state = if rec.state == "scheduled" && rec.run_at.is_some_and(|t| t <= now) {
            "pending"
        } else {
            rec.state.as_str()
        };
        *by_state.entry(state.to_string()).or_default() += 1;
    }
    by_state
}

async fn randomized_mix_keeps_counts_and_indexes_exact(store: StoreKind) {
    let c = Cluster::on(store);
    let a = c.node();
    let b = c.node();
    let _wa = register(&a, T, b"wa").await;
    let _wb = register(&b, T, b"wb").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    let mut tasks = Vec::new();
    for (n, (node, worker)) in
        [(a.clone(), &b"wa"[..]), (b.clone(), &b"wb"[..]), (a.clone(), &b"wa"[..])].into_iter().enumerate()
    {
        let worker = worker.to_vec();
        tasks.push(tokio::spawn(async move {
            let jobs = node.jobs().clone();
            let mut rng = StdRng::seed_from_u64(0x13 + n as u64);
            let mut held = Vec::new();
            let mut steps = 0u64;
            while tokio::time::Instant::now() < deadline {
                step(&jobs, &mut held, &worker, &mut rng).await;
                steps += 1;
            }
            steps
        }));
    }
    let mut steps = 0;
    for t in tasks {
        steps += t.await.expect("a task of random calls panicked");
    }
    assert!(steps > 100, "only {steps} calls ran");
    a.jobs().set_paused(T, false).await.unwrap();

    let db: Db = c.db();
    // Jobs kept 0 s are pruned by the nodes' pruners, which may run
    // between a snapshot and the counts call: the counts are checked
    // against the records only when a second snapshot, taken after the
    // call, shows the same states (nothing was pruned in between; nothing
    // else writes once the mix is over). Otherwise again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let (by_state, counts) = loop {
        let snap = snapshot(db.as_ref(), a.keyspace()).await;
        snap.assert_ok("after the randomized mix");
        let before = states_of(&snap);
        let counts = a.jobs().counts(T).await.unwrap();
        let after = states_of(&snapshot(db.as_ref(), a.keyspace()).await);
        if before == after {
            break (before, counts);
        }
        assert!(tokio::time::Instant::now() < deadline, "the records kept changing: {before:?} then {after:?}");
    };
    for (state, n) in counts {
        let want = by_state.get(state.name()).copied().unwrap_or(0);
        // A scheduled job may fall due between the snapshot and the call.
        if matches!(state, JobState::Scheduled | JobState::Pending) {
            assert!(n.abs_diff(want) <= by_state.get("scheduled").copied().unwrap_or(0), "{state:?}: {n} vs {want}");
        } else {
            assert_eq!(n, want, "{state:?}");
        }
    }
    println!("{steps} calls; states at the end: {by_state:?}");
    a.stop().await;
    b.stop().await;
}

#[test]
fn backoff_is_exponential_jittered_and_capped() {
    let r = Retry::Backoff { base_ms: 1000, max_ms: 10_000 };
    for _ in 0..200 {
        for (attempts, full) in [(1u64, 1000u64), (2, 2000), (3, 4000), (4, 8000), (5, 10_000), (60, 10_000)] {
            let d = r.delay_ms(attempts).unwrap();
            assert!(d <= full && d >= full - full / 4, "attempts {attempts}: {d}");
        }
    }
    assert_eq!(Retry::No.delay_ms(3), None);
    assert_eq!(Retry::After(7).delay_ms(3), Some(7));
    // The jitter spreads jobs that failed together.
    let spread: std::collections::BTreeSet<u64> = (0..50).map(|_| r.delay_ms(3).unwrap()).collect();
    assert!(spread.len() > 10);
}

async fn a_scheduled_job_moves_to_pending_only_when_due(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let _w = register(&node, T, b"w").await;
    let at = couch_workers_core::jobs::wall_ms() + 300;
    let o = JobOpts { schedule: Some(Schedule::RunAt(at)), ..JobOpts::default() };
    jobs.add_with(T, b"j", b"{}", &o).await.unwrap();
    assert_eq!(get(jobs, T, b"j").await.state, JobState::Scheduled);
    assert_eq!(jobs.accept(T, b"w", Duration::ZERO).await, Err(Error::NotFound));
    let h = jobs.accept(T, b"w", Duration::from_secs(5)).await.expect("accepted when due");
    assert!(couch_workers_core::jobs::wall_ms() >= at);
    assert_eq!(h.job.run_at, None);
    assert_eq!(pending_keys(&node, T).await, 0);
    node.stop().await;
}

/// A death (`Node::worker_died`, what a pid exit is) fails the running
/// jobs with `worker_lost` and spends their attempt; an unregister
/// releases them (attempt kept, `max_attempts` raised by one).
async fn a_death_fails_running_jobs_an_unregister_releases_them(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let once = JobOpts { max_attempts: Some(MaxAttempts::Limit(1)), ..JobOpts::default() };
    let twice = JobOpts { max_attempts: Some(MaxAttempts::Limit(2)), ..JobOpts::default() };
    jobs.add_with(T, b"once", b"{}", &once).await.unwrap();
    jobs.add_with(T, b"twice", b"{}", &twice).await.unwrap();
    let w = register(&node, T, b"w").await;
    accept_now(jobs, T, b"w").await;
    accept_now(jobs, T, b"w").await;
    node.worker_died(&w).await.unwrap();
    let lost = br#"{"reason":"worker_lost"}"#.to_vec();
    let j = get(jobs, T, b"once").await;
    assert_eq!((j.state, j.attempts, j.error.as_ref()), (JobState::Failed, 1, Some(&lost)));
    let j = get(jobs, T, b"twice").await;
    assert_eq!((j.state, j.attempts, j.error.as_ref()), (JobState::Pending, 1, Some(&lost)));

    let w2 = register(&node, T, b"w2").await;
    accept_now(jobs, T, b"w2").await;
    node.unregister_worker(&w2).await.unwrap();
    let j = get(jobs, T, b"twice").await;
    assert_eq!((j.state, j.attempts, j.max_attempts), (JobState::Pending, 2, MaxAttempts::Limit(3)));
    node.stop().await;
}

// Four worker threads for the randomized mix's three tasks of calls (the
// other tests need no more than the default).
couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread", worker_threads = 4),
    stores: [embedded: Embedded],
    tests: [
        randomized_mix_keeps_counts_and_indexes_exact,
        a_scheduled_job_moves_to_pending_only_when_due,
        a_death_fails_running_jobs_an_unregister_releases_them,
    ],
);
