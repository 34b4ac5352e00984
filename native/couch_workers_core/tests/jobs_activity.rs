//! Activity timeouts: a running job whose record does not change for its
//! `activity_timeout` is taken back from its worker (an attempt spent,
//! pending again, error `activity_timeout`, history outcome `timeout`),
//! once, by its worker's node, which tells the owner; updates keep it;
//! a store stall longer than the timeout times nothing out; a pass of the
//! observer reads the due index keys and no others; a type's default
//! timeout applies to the runs accepted after it is set. On every store.

mod jobs_common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use couch_workers_core::jobs::job::ActivityTimeout;
use couch_workers_core::jobs::ops::{self, Take};
use couch_workers_core::jobs::{JobHandle, JobOpts, JobSpec, JobState, TypeSetting};
use couch_workers_core::keyspace::{Incarnation, Keyspace};
use couch_workers_core::roster;
use couch_workers_core::services::activity::{ActivityCounts, ActivityObserver, LocalWorkers, Observation};
use couch_workers_core::services::owner_events::OwnerEvents;
use couch_workers_core::store::faulty::{FaultPlan, FaultyStore};
use couch_workers_core::store::{run, Db, TxOptions};
use couch_workers_core::{Error, Node, OwnerEvent, Settings};
use jobs_common::*;
use tokio_util::sync::CancellationToken;

const T: &[u8] = b"indexer";

fn timeout(s: u64) -> JobOpts {
    JobOpts { activity_timeout: Some(ActivityTimeout::Seconds(s)), ..JobOpts::default() }
}

async fn add_timed(node: &Node, id: &[u8], s: u64) {
    node.jobs().add_with(T, id, b"{}", &timeout(s)).await.expect("add");
}

/// The owner events of a registration, collected.
fn owner_log() -> (couch_workers_core::OnOwnerEvent, Arc<Mutex<Vec<OwnerEvent>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    (Box::new(move |e| s.lock().unwrap().push(e)), seen)
}

fn timed_out(id: &[u8]) -> OwnerEvent {
    OwnerEvent::JobTimedOut { job_type: T.to_vec(), job_id: id.to_vec() }
}

/// Waits (bounded) until the job is no longer running.
async fn until_taken_back(node: &Node, id: &[u8], within: Duration) -> couch_workers_core::Job {
    until_not_running(node.jobs(), T, id, within).await
}

/// Updates `h` every `every` until `stop`; returns the last handle. An
/// update that fails (a stalled store) is tried again at the next tick.
async fn keep_updating(node: Arc<Node>, h: JobHandle, every: Duration, stop: CancellationToken) -> JobHandle {
    let mut h = h;
    while !stop.is_cancelled() {
        match node.jobs().update(&h.fence(), b"{\"alive\":true}").await {
            Ok(next) => h = next,
            Err(Error::NotOwner) | Err(Error::NotFound) => panic!("the updated job was taken back"),
            Err(_) => {}
        }
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(every) => {}
        }
    }
    h
}

async fn a_job_not_updated_is_taken_back_once_and_its_handle_refused(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let reg = register(&node, T, b"w").await;
    let (listener, told) = owner_log();
    assert!(!reg.listen(listener));
    add_timed(&node, b"idle", 1).await;
    add_timed(&node, b"busy", 1).await;
    let idle = accept_now(jobs, T, b"w").await;
    let busy = accept_now(jobs, T, b"w").await;
    assert_eq!((idle.job.id.as_slice(), busy.job.id.as_slice()), (&b"idle"[..], &b"busy"[..]));
    let stop = CancellationToken::new();
    let updater = tokio::spawn(keep_updating(node.clone(), busy, Duration::from_millis(200), stop.clone()));

    let started = Instant::now();
    let job = until_taken_back(&node, b"idle", Duration::from_secs(8)).await;
    let took = started.elapsed();
    assert_eq!(job.state, JobState::Pending, "back to pending: attempts are left");
    assert_eq!(job.attempts, 1, "the run spent its attempt");
    assert_eq!(job.error.as_deref(), Some(&br#"{"reason":"activity_timeout"}"#[..]));
    assert!(took >= Duration::from_millis(900), "not before its timeout: {took:?}");
    let (_, runs) = jobs.get_with_history(T, b"idle").await.expect("history");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].outcome.name(), "timeout");
    assert_eq!(runs[0].error.as_deref(), Some(&br#"{"reason":"activity_timeout"}"#[..]));
    assert_eq!(jobs.update(&idle.fence(), b"{}").await, Err(Error::NotOwner));
    assert_eq!(jobs.finish(&idle.fence(), b"{}").await, Err(Error::NotOwner));
    assert_eq!(*told.lock().unwrap(), vec![timed_out(b"idle")], "the owner is told");

    // The worker's other job, updated, runs on; the worker is still a member.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.cancel();
    let busy = updater.await.expect("the updater");
    assert_eq!(get(jobs, T, b"busy").await.state, JobState::Running);
    assert!(!reg.is_removed());
    jobs.finish(&busy.fence(), b"{}").await.expect("the updated job finishes");
    // Taken back once: one run ended, one owner event, one count.
    assert_eq!(jobs.get_with_history(T, b"idle").await.unwrap().1.len(), 1);
    assert_eq!(*told.lock().unwrap(), vec![timed_out(b"idle")]);
    assert_eq!(node.activity_counts().taken_back.load(std::sync::atomic::Ordering::SeqCst), 1);
    // Its last attempt spent, a timed-out job fails, still as a timeout.
    let again = accept_now(jobs, T, b"w").await;
    assert_eq!(again.job.attempts, 2);
    node.jobs().remove(T, b"idle").await.unwrap();
    let one_try = JobOpts { max_attempts: Some(couch_workers_core::MaxAttempts::Limit(1)), ..timeout(1) };
    jobs.add_with(T, b"last", b"{}", &one_try).await.unwrap();
    let _last = accept_now(jobs, T, b"w").await;
    let job = until_taken_back(&node, b"last", Duration::from_secs(8)).await;
    assert_eq!((job.state, job.attempts), (JobState::Failed, 1));
    let (_, runs) = jobs.get_with_history(T, b"last").await.unwrap();
    assert_eq!(runs[0].outcome.name(), "timeout");
    node.stop().await;
}

async fn updates_keep_a_job_running_past_several_timeouts(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let _reg = register(&node, T, b"w").await;
    add_timed(&node, b"j", 1).await;
    let h = accept_now(node.jobs(), T, b"w").await;
    let stop = CancellationToken::new();
    let updater = tokio::spawn(keep_updating(node.clone(), h, Duration::from_millis(250), stop.clone()));
    tokio::time::sleep(Duration::from_millis(3500)).await;
    stop.cancel();
    let h = updater.await.expect("the updater");
    assert_eq!(get(node.jobs(), T, b"j").await.state, JobState::Running);
    assert_eq!(node.activity_counts().taken_back.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert!(node.activity_counts().passes.load(std::sync::atomic::Ordering::SeqCst) >= 4, "the observer looked");
    node.jobs().finish(&h.fence(), b"{}").await.expect("finished by its worker");
    node.stop().await;
}

/// Every call fails while enabled (a store that takes no write).
fn stall_plan() -> FaultPlan {
    FaultPlan { enabled: false, ..FaultPlan::retryable(7, 1.0) }
}

async fn a_store_stall_longer_than_the_timeout_times_nothing_out(store: StoreKind) {
    let c = Cluster::on(store);
    let faulty = FaultyStore::wrap(c.db(), stall_plan());
    let settings = Settings { tx_timeout: Duration::from_millis(400), ..Settings::default() };
    let db: Db = faulty.clone();
    let node = Node::with_db(db, settings, Arc::new(couch_workers_core::log::Discard));
    let reg = node.register_worker(spec_long(b"w")).await.expect("register");
    let (listener, told) = owner_log();
    assert!(!reg.listen(listener));
    add_timed(&node, b"j", 2).await;
    let h = accept_now(node.jobs(), T, b"w").await;
    let stop = CancellationToken::new();
    let updater = tokio::spawn(keep_updating(node.clone(), h, Duration::from_millis(300), stop.clone()));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    stop.cancel();
    let h = updater.await.expect("the updater");
    // 3 s without a write (the timeout is 2 s): no update could land.
    faulty.set_enabled(true);
    tokio::time::sleep(Duration::from_secs(3)).await;
    faulty.set_enabled(false);
    // The worker has a whole timeout after the stall: it updates again
    // 1.5 s after it. An observer that counted the stall would have taken
    // the job back by then.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let stop = CancellationToken::new();
    let updater = tokio::spawn(keep_updating(node.clone(), h, Duration::from_millis(300), stop.clone()));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    stop.cancel();
    let h = updater.await.expect("the updater");
    assert_eq!(get(node.jobs(), T, b"j").await.state, JobState::Running);
    assert!(told.lock().unwrap().is_empty(), "no timeout told: {:?}", told.lock().unwrap());
    node.jobs().finish(&h.fence(), b"{}").await.expect("still its worker's");
    node.stop().await;
}

fn spec_long(id: &[u8]) -> couch_workers_core::WorkerSpec {
    // A worker that outlives the stall (never reaped meanwhile).
    couch_workers_core::WorkerSpec { timeout_s: 3600, ..spec(T, id) }
}

/// A second observer on the node, with the node's own registrations: the
/// two race for the job, and it is taken back once.
async fn two_observers_take_a_job_back_once(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let reg = register(&node, T, b"w").await;
    let (listener, told) = owner_log();
    assert!(!reg.listen(listener));
    let second = ActivityObserver {
        ctx: node.context().clone(),
        cancel: CancellationToken::new(),
        local: node.local_workers(),
        counts: Arc::new(ActivityCounts::default()),
    };
    let other = tokio::spawn(second.clone().run());
    for id in [&b"a"[..], b"b", b"c"] {
        add_timed(&node, id, 1).await;
        accept_now(node.jobs(), T, b"w").await;
    }
    for id in [&b"a"[..], b"b", b"c"] {
        let job = until_taken_back(&node, id, Duration::from_secs(8)).await;
        assert_eq!((job.state, job.attempts), (JobState::Pending, 1));
    }
    // Both observers had their chance at each.
    tokio::time::sleep(Duration::from_millis(800)).await;
    second.cancel.cancel();
    other.await.expect("the second observer");
    let count = |c: &ActivityCounts| c.taken_back.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(count(node.activity_counts()) + count(&second.counts), 3, "three take-backs in all");
    let mut seen = told.lock().unwrap().clone();
    seen.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(seen, vec![timed_out(b"a"), timed_out(b"b"), timed_out(b"c")], "each told once");
    for id in [&b"a"[..], b"b", b"c"] {
        assert_eq!(node.jobs().get_with_history(T, id).await.unwrap().1.len(), 1, "one run ended");
    }
    node.stop().await;
}

/// Waits (bounded) until the node has read the type's default timeout.
async fn until_default(node: &Node, want: Option<i64>) {
    let known = || node.keyspace().type_timeouts().get(T) == want;
    assert!(eventually(Duration::from_secs(5), || async { known() }).await, "the node read the type's default");
}

/// The type's `activity_timeout` applies to the runs of jobs with none
/// of their own that are accepted after the node read it; a run accepted
/// before keeps running; a job's own `infinity` wins over it.
async fn a_types_default_applies_to_runs_accepted_after_it_is_set(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let reg = register(&node, T, b"w").await;
    let (listener, told) = owner_log();
    assert!(!reg.listen(listener));
    jobs.add(T, b"before", b"{}", 0).await.unwrap();
    let before = accept_now(jobs, T, b"w").await;
    jobs.set_type_settings(T, &[TypeSetting::ActivityTimeout(Some(1))]).await.unwrap();
    // An idle observer is woken by the change, and reads it.
    until_default(&node, Some(1)).await;
    jobs.add(T, b"after", b"{}", 0).await.unwrap();
    let never = JobOpts { activity_timeout: Some(ActivityTimeout::Infinity), ..JobOpts::default() };
    jobs.add_with(T, b"never", b"{}", &never).await.unwrap();
    let after = accept_now(jobs, T, b"w").await;
    let _never = accept_now(jobs, T, b"w").await;
    assert_eq!(after.job.id, b"after");
    let job = until_taken_back(&node, b"after", Duration::from_secs(8)).await;
    assert_eq!((job.state, job.attempts), (JobState::Pending, 1));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(get(jobs, T, b"never").await.state, JobState::Running, "its own infinity wins");
    assert_eq!(get(jobs, T, b"before").await.state, JobState::Running, "accepted before the default was set");
    assert_eq!(*told.lock().unwrap(), vec![timed_out(b"after")]);
    // Updated now, the earlier run takes the type's timeout from then on.
    jobs.update(&before.fence(), b"{}").await.expect("still its worker's");
    let job = until_taken_back(&node, b"before", Duration::from_secs(8)).await;
    assert_eq!(job.error.as_deref(), Some(&br#"{"reason":"activity_timeout"}"#[..]));
    // Back to infinity: a run accepted after that is not timed out.
    jobs.set_type_settings(T, &[TypeSetting::ActivityTimeout(None)]).await.unwrap();
    until_default(&node, None).await;
    let again = accept_now(jobs, T, b"w").await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(get(jobs, T, &again.job.id).await.state, JobState::Running);
    node.stop().await;
}

/// An observer's registrations: nobody's (it reads, takes nothing).
struct Nobody;

impl LocalWorkers for Nobody {
    fn owners(&self) -> HashMap<(Vec<u8>, Vec<u8>), Arc<OwnerEvents>> {
        HashMap::new()
    }
}

/// The incarnation of the worker registered by hand (no heartbeat task:
/// no node owns it, so no observer takes its jobs).
const INC: Incarnation = [7; 16];

/// `n` running jobs of worker `w` with `opts`, added and accepted in big
/// transactions (their ids `prefix` and a number).
async fn running(db: &Db, ks: &Keyspace, w: &[u8], prefix: &str, n: usize, opts: &JobOpts) {
    let specs: Vec<JobSpec> = (0..n)
        .map(|i| JobSpec { id: format!("{prefix}{i:06}").into_bytes(), info: b"{}".to_vec(), opts: opts.clone() })
        .collect();
    for chunk in specs.chunks(5000) {
        let now = couch_workers_core::jobs::wall_ms();
        run(db.as_ref(), TxOptions::write(), |tx| async move { ops::add_many_jobs(&tx, ks, T, chunk, now).await })
            .await
            .expect("add")
            .expect("added");
    }
    let mut taken = 0;
    while taken < n {
        let waiters = vec![w.to_vec(); (n - taken).min(2000)];
        let tokens = ops::new_tokens(waiters.len());
        let acceptors = ops::Acceptors {
            workers: &waiters,
            incarnations: &[],
            tokens: &tokens,
            recheck: false,
            retries: 0,
            claims: None,
        };
        let round = run(db.as_ref(), TxOptions::write(), |tx| async move { ops::accept(&tx, ks, T, acceptors).await })
            .await
            .expect("accept");
        let now = round.takes.iter().filter(|t| matches!(t, Take::Job(_))).count();
        assert!(now > 0, "each round takes jobs");
        taken += now;
    }
}

/// The index entries of `n` running jobs of worker `w` with timeout
/// `timeout_s`, written as their accepts would write them (each with the
/// versionstamp of its commit). A pass reads the index and nothing else
/// until a job is due: writing the jobs' records too (half a minute for
/// 100,000 on the embedded store, more on `sim`) would only slow the test.
async fn indexed(db: &Db, ks: &Keyspace, w: &[u8], n: usize, timeout_s: i64) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(10_000) {
        run(db.as_ref(), TxOptions::write(), |tx| async move {
            for (uv, i) in chunk.iter().enumerate() {
                let id = format!("long-{i:06}").into_bytes();
                tx.set_versionstamped_key(&ks.activity_new(T, timeout_s, uv as u16, &id), w);
            }
            Ok(())
        })
        .await
        .expect("index entries");
    }
}

async fn a_pass_reads_the_due_keys_only_among_100000_running_jobs(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let (db, ks) = (node.db().clone(), node.keyspace().clone());
    let worker = couch_workers_core::WorkerSpec { timeout_s: 3600, ..spec(T, b"w") };
    let (k, w) = (&ks, &worker);
    run(db.as_ref(), TxOptions::write(), |tx| async move { roster::register(&tx, k, w, &INC, 0).await })
        .await
        .expect("register");
    let setup = Instant::now();
    indexed(&db, &ks, b"w", 100_000, 3600).await;
    eprintln!("100,000 index entries in {:?}", setup.elapsed());
    let observer = ActivityObserver {
        ctx: node.context().clone(),
        cancel: CancellationToken::new(),
        local: Arc::new(Nobody),
        counts: Arc::new(ActivityCounts::default()),
    };
    // Passes at the observer's cadence for a while: none due, each reads
    // the one oldest key of the type's timeout.
    let mut obs = Observation::default();
    for _ in 0..5 {
        let pass = observer.pass(&mut obs).await.expect("a pass");
        assert_eq!(pass.examined, 1, "none due: the bucket's oldest key only");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // 50 jobs with a 1 s timeout, not updated: due after a second of
    // passes; a pass then reads them, and the other bucket's oldest key.
    running(&db, &ks, b"w", "short-", 50, &timeout(1)).await;
    assert_eq!(node.jobs().counts(T).await.unwrap()[2], (JobState::Running, 50), "50 real running jobs");
    let started = Instant::now();
    let mut examined = Vec::new();
    // (A loaded machine's slow look starts the observation again: the
    // jobs are then due a second later.)
    while examined.last() != Some(&51) && started.elapsed() < Duration::from_secs(8) {
        let pass = observer.pass(&mut obs).await.expect("a pass");
        assert!(pass.taken.is_empty(), "nobody's observer takes nothing");
        examined.push(pass.examined);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(examined.first(), Some(&2), "not yet due: each bucket's oldest key: {examined:?}");
    assert_eq!(examined.last(), Some(&51), "due: the 50 and one key of the other bucket: {examined:?}");
    assert!(examined.iter().all(|&n| n == 2 || n == 51), "{examined:?}");
    node.stop().await;
}

couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread"),
    stores: [embedded: Embedded, sim: Sim],
    tests: [
        a_job_not_updated_is_taken_back_once_and_its_handle_refused,
        updates_keep_a_job_running_past_several_timeouts,
        a_store_stall_longer_than_the_timeout_times_nothing_out,
        two_observers_take_a_job_back_once,
        a_pass_reads_the_due_keys_only_among_100000_running_jobs,
        a_types_default_applies_to_runs_accepted_after_it_is_set,
    ],
);
