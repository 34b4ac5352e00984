//! The key-space conformance suite: the workers, membership and job queue
//! code of this crate, run against every store (the embedded and `sim`
//! stores always; FoundationDB when `FDB_CLUSTER_FILE` is set), so that the very functions
//! the services call are proven on each store, not only the raw store
//! semantics that [`crate::conformance`] checks.
//!
//! It goes through the public surface only: the worker operations of
//! [`crate::workers`] over a [`Tx`](crate::store::Tx) in the one retry loop, and the job
//! queue through [`Node::with_db`] and [`Node::jobs`] (plus
//! [`crate::jobs::ops`] where a test needs an operation inside a
//! transaction of its own).
//!
//! # How a store plugs in
//!
//! Exactly as for [`crate::conformance`]: the same [`StoreFactory`]
//! (`open_fresh() -> TestDb`, `open_second(&first) -> TestDb`), and
//!
//! ```text
//! couch_workers_core::keyspace_conformance_tests!(open_fresh, open_second);
//! // or, with attributes put on every generated test:
//! couch_workers_core::keyspace_conformance_tests!(open_fresh, open_second, attrs: #[ignore = "needs FDB"]);
//! ```
//!
//! It may be invoked in the same test crate as `store_conformance_tests!`,
//! but in a module of its own (the two define a factory type each).
//!
//! Rules the suite keeps, and the store must allow:
//!
//! * every key it touches is the crate's key space under `db.prefix()`
//!   (`prefix ++ pack(("couch_workers", ...))`): a fresh store must be
//!   empty there;
//! * nodes started by a test (their reaper, sweeper and dispatchers) are
//!   stopped at its end with [`Node::stop`], which closes their handle;
//! * every test takes well under 3 s on an idle machine.
//!
//! Each behaviour is a `pub async fn(&dyn StoreFactory)`, callable on its
//! own, and each checks an outcome.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::conformance::StoreFactory;
use crate::jobs::{ops, AddManyError, Fence, JobHandle, JobService, JobState, NewJob};
use crate::keyspace::{Health, Incarnation, Keyspace};
use crate::store::{run, run_with_info, CommitInfo, Db, KeyValue, RangeRequest, StoreError, TxOptions, Versionstamp};
use crate::workers::{self, Heartbeat, Membership, WorkerSpec};
use crate::{Error, Node, Settings};

/// Expands the key-space conformance suite into one tokio test per
/// behaviour. See the [module doc](crate::conformance_keyspace).
#[macro_export]
macro_rules! keyspace_conformance_tests {
    ($open_fresh:expr, $open_second:expr) => {
        $crate::keyspace_conformance_tests!($open_fresh, $open_second, attrs:);
    };
    ($open_fresh:expr, $open_second:expr, attrs: $(#[$attr:meta])*) => {
        $crate::__cw_conformance_store!(__CwKeyspaceConformanceStore, $open_fresh, $open_second);

        $crate::__cw_conformance_cases!(conformance_keyspace, __CwKeyspaceConformanceStore, [$(#[$attr])*]
            workers_register_writes_member_health_and_bumps_vs,
            workers_register_again_is_a_new_incarnation,
            workers_heartbeat_renews_health_without_bumping_vs,
            workers_heartbeat_reinstates_a_removed_worker,
            workers_remove_clears_member_and_health_once,
            workers_remove_of_an_old_incarnation_leaves_the_new_one,
            workers_heartbeat_of_an_old_incarnation_renews_nothing,
            workers_read_membership_is_exactly_the_registered_set,
            workers_types_stay_separate,
            workers_reap_spares_a_renewed_worker,
            workers_reap_removes_the_observed_record,
            workers_reap_leaves_another_incarnation,
            workers_concurrent_reap_removes_once,
            membership_watch_fires_on_change_not_on_heartbeat,
            membership_changes_since_a_versionstamp,
            membership_changes_incomplete_when_log_trimmed,
            membership_watcher_incremental_matches_full_reads,
            jobs_add_get_pending_count,
            jobs_priority_then_fifo_across_handles,
            jobs_accept_needs_a_registered_worker,
            jobs_update_finish_fencing,
            jobs_cancel_pending_and_running,
            jobs_remove_running,
            jobs_failover_in_the_removing_transaction,
            jobs_add_many_all_or_nothing,
            jobs_blocking_accept_woken_by_other_handle,
        );
    };
}

// ---- helpers -----------------------------------------------------------

/// The job and worker type most tests use.
const T: &[u8] = b"replicator";

/// The informational wall clock of the health records written here.
const TSTAMP: i64 = 1_700_000_000;

/// The incarnation the helpers register, beat and remove as, unless a test
/// names another (`*_as`).
const INC: Incarnation = [7; 16];

fn ks_of(db: &Db) -> Keyspace {
    Keyspace::new(&db.prefix())
}

fn spec(worker_type: &[u8], id: &[u8], options: &[u8], timeout_s: u64) -> WorkerSpec {
    WorkerSpec { worker_type: worker_type.to_vec(), id: id.to_vec(), options_json: options.to_vec(), timeout_s }
}

fn info(n: usize) -> Vec<u8> {
    format!("{{\"n\":{n}}}").into_bytes()
}

fn stamp_of(info: &CommitInfo) -> Versionstamp {
    info.versionstamp.expect("the commit wrote a versionstamp")
}

/// Registers `spec` in a transaction of its own; the commit's versionstamp.
async fn register(db: &Db, spec: &WorkerSpec) -> Versionstamp {
    register_as(db, spec, &INC).await
}

async fn register_as(db: &Db, spec: &WorkerSpec, inc: &Incarnation) -> Versionstamp {
    let ks = &ks_of(db);
    let ((), info) = run_with_info(&**db, TxOptions::write(), |tx| async move {
        workers::register(&tx, ks, spec, inc, TSTAMP).await
    })
    .await
    .expect("register commits");
    stamp_of(&info)
}

async fn heartbeat(db: &Db, spec: &WorkerSpec, tstamp: i64) -> (Heartbeat, CommitInfo) {
    heartbeat_as(db, spec, &INC, tstamp).await
}

async fn heartbeat_as(db: &Db, spec: &WorkerSpec, inc: &Incarnation, tstamp: i64) -> (Heartbeat, CommitInfo) {
    let ks = &ks_of(db);
    run_with_info(&**db, TxOptions::write(), |tx| async move { workers::heartbeat(&tx, ks, spec, inc, tstamp).await })
        .await
        .expect("heartbeat commits")
}

async fn remove(db: &Db, worker_type: &[u8], id: &[u8]) -> (bool, CommitInfo) {
    remove_as(db, worker_type, id, &INC).await
}

async fn remove_as(db: &Db, worker_type: &[u8], id: &[u8], inc: &Incarnation) -> (bool, CommitInfo) {
    let ks = &ks_of(db);
    run_with_info(&**db, TxOptions::write(), |tx| async move { workers::remove(&tx, ks, worker_type, id, inc).await })
        .await
        .expect("remove commits")
}

/// Reaps `id` if its health record is still `observed`.
async fn reap(db: &Db, worker_type: &[u8], id: &[u8], observed: &[u8]) -> (bool, CommitInfo) {
    let ks = &ks_of(db);
    run_with_info(&**db, TxOptions::write(), |tx| async move { workers::reap(&tx, ks, worker_type, id, observed).await })
        .await
        .expect("reap commits")
}

async fn membership(db: &Db, worker_type: &[u8]) -> Membership {
    let ks = &ks_of(db);
    run(&**db, TxOptions::read(), |tx| async move { workers::read_membership(&tx, ks, worker_type).await })
        .await
        .expect("read membership")
}

async fn health(db: &Db, worker_type: &[u8], id: &[u8]) -> Option<Health> {
    let ks = &ks_of(db);
    run(&**db, TxOptions::read(), |tx| async move { workers::read_health(&tx, ks, worker_type, id).await })
        .await
        .expect("read health")
}

async fn raw_get(db: &Db, key: &[u8]) -> Option<Vec<u8>> {
    run(&**db, TxOptions::read(), |tx| async move { tx.get(key, false).await }).await.expect("read")
}

async fn raw_set(db: &Db, key: &[u8], value: &[u8]) {
    run(&**db, TxOptions::write(), |tx| async move {
        tx.set(key, value);
        Ok(())
    })
    .await
    .expect("write")
}

async fn range(db: &Db, (begin, end): (Vec<u8>, Vec<u8>)) -> Vec<KeyValue> {
    let r = &RangeRequest::new(begin, end);
    run(&**db, TxOptions::read(), |tx| async move { tx.get_range(r).await }).await.expect("range read")
}

fn node(db: &Db) -> Arc<Node> {
    Node::with_db(db.clone(), Settings::default(), Arc::new(crate::log::Discard))
}

async fn accept_now(jobs: &JobService, worker: &[u8]) -> JobHandle {
    jobs.accept(T, worker, Duration::ZERO).await.expect("a job to accept")
}

async fn count(jobs: &JobService) -> u64 {
    jobs.pending_count(T).await.expect("pending count")
}

fn sorted(mut v: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<(Vec<u8>, Vec<u8>)> {
    v.sort();
    v
}

// ---- workers -----------------------------------------------------------

/// `register` writes the member (the options bytes as given) and a health
/// record stamped with its commit, and sets the type's `vs` to the
/// commit's versionstamp: a greater one at every register, through either
/// handle. Registering the same id again replaces its options.
pub async fn workers_register_writes_member_health_and_bumps_vs(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let ks = ks_of(&a.db);
    let empty = membership(&a.db, T).await;
    assert_eq!(empty.vs, [0; 10], "a type never changed has the zero vs");
    assert!(empty.workers.is_empty());

    let w1 = spec(T, b"w1", br#"{"timeout":15,"n":1}"#, 15);
    let vs1 = register(&a.db, &w1).await;
    assert_eq!(raw_get(&b.db, &ks.member(T, b"w1")).await, Some(w1.options_json.clone()));
    let h = health(&b.db, T, b"w1").await.expect("a health record");
    assert_eq!(h, Health { versionstamp: vs1, tstamp: TSTAMP, timeout_s: 15, incarnation: Some(INC) });
    assert_eq!(membership(&b.db, T).await.vs, vs1, "vs is the register's commit versionstamp");

    let w2 = spec(T, b"w2", br#"{"n":2}"#, 7);
    let vs2 = register(&b.db, &w2).await;
    assert!(vs2 > vs1, "a register through the second handle gets a greater vs");
    assert_eq!(membership(&a.db, T).await.vs, vs2);
    assert_eq!(health(&a.db, T, b"w2").await.map(|h| h.timeout_s), Some(7));

    let w1_again = spec(T, b"w1", br#"{"n":"again"}"#, 3);
    let vs3 = register_as(&a.db, &w1_again, &[3; 16]).await;
    assert!(vs3 > vs2);
    let m = membership(&b.db, T).await;
    assert_eq!(m.vs, vs3);
    assert_eq!(m.workers, vec![(b"w1".to_vec(), w1_again.options_json.clone()), (b"w2".to_vec(), w2.options_json.clone())]);
    let again = Health { versionstamp: vs3, tstamp: TSTAMP, timeout_s: 3, incarnation: Some([3; 16]) };
    assert_eq!(health(&b.db, T, b"w1").await, Some(again));
}

/// Registering an existing `(type, id)` starts a new incarnation: the jobs
/// the old one was running go back to pending in that transaction, and its
/// handles are refused, also once the new incarnation takes the job again.
pub async fn workers_register_again_is_a_new_incarnation(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let (na, nb) = (node(&a.db), node(&b.db));
    let ks = ks_of(&a.db);
    register(&a.db, &spec(T, b"w", b"{}", 15)).await;
    na.jobs().add(T, b"j", &info(1), 0).await.expect("add");
    let h = accept_now(na.jobs(), b"w").await;
    assert_eq!(count(nb.jobs()).await, 0);

    let before = membership(&a.db, T).await.vs;
    let vs = register_as(&b.db, &spec(T, b"w", br#"{"incarnation":2}"#, 15), &[2; 16]).await;
    assert!(vs > before);
    let job = nb.jobs().get(T, b"j").await.expect("get");
    assert_eq!((job.state, job.worker.clone(), job.attempts), (JobState::Pending, None, 1));
    assert!(job.vs > h.job.vs);
    assert_eq!(count(na.jobs()).await, 1);
    assert!(range(&a.db, ks.active_range(T, b"w")).await.is_empty());
    assert_eq!(na.jobs().update(&h.fence(), b"{}").await, Err(Error::NotOwner));
    assert_eq!(nb.jobs().finish(&h.fence(), b"{}").await, Err(Error::NotOwner));

    let h2 = accept_now(nb.jobs(), b"w").await;
    assert_eq!((h2.job.id.as_slice(), h2.job.attempts), (b"j".as_slice(), 2));
    assert_ne!(h2.token, h.token);
    assert_eq!(na.jobs().finish(&h.fence(), b"{}").await, Err(Error::NotOwner), "the old handle stays refused");
    na.jobs().finish(&h2.fence(), br#"{"ok":true}"#).await.expect("the new handle finishes");
    assert_eq!(nb.jobs().get(T, b"j").await.expect("get").state, JobState::Finished);
    na.stop().await;
    nb.stop().await;
}

/// A heartbeat renews the health record (a greater versionstamp: the
/// heartbeat's commit) and leaves the member and the type's `vs` alone.
pub async fn workers_heartbeat_renews_health_without_bumping_vs(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let w = spec(T, b"w", br#"{"k":"v"}"#, 15);
    let vs0 = register(&a.db, &w).await;
    let h0 = health(&a.db, T, b"w").await.expect("health");
    let mut last = h0.versionstamp;
    for (i, db) in [&b.db, &a.db, &b.db].into_iter().enumerate() {
        let (beat, info) = heartbeat(db, &w, TSTAMP + 1 + i as i64).await;
        assert_eq!(beat, Heartbeat::Renewed);
        let h = health(&a.db, T, b"w").await.expect("health");
        assert_eq!(h.versionstamp, stamp_of(&info), "the record carries the heartbeat's commit");
        assert!(h.versionstamp > last, "heartbeat {i}: the health VS grows");
        assert_eq!((h.tstamp, h.timeout_s), (TSTAMP + 1 + i as i64, 15));
        last = h.versionstamp;
    }
    let m = membership(&b.db, T).await;
    assert_eq!(m.vs, vs0, "heartbeats do not change the membership vs");
    assert_eq!(m.workers, vec![(b"w".to_vec(), w.options_json.clone())]);
}

/// A heartbeat of a removed worker registers it again (`Reinstated`),
/// which is a membership change; the next one is a plain renewal.
pub async fn workers_heartbeat_reinstates_a_removed_worker(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let w = spec(T, b"w", br#"{"back":true}"#, 15);
    register(&a.db, &w).await;
    let (removed, info) = remove(&b.db, T, b"w").await;
    assert!(removed);
    let removed_vs = stamp_of(&info);
    assert!(membership(&a.db, T).await.workers.is_empty());

    let (beat, info) = heartbeat(&a.db, &w, TSTAMP).await;
    assert_eq!(beat, Heartbeat::Reinstated);
    let vs = stamp_of(&info);
    assert!(vs > removed_vs);
    let m = membership(&b.db, T).await;
    assert_eq!(m.vs, vs, "a reinstatement bumps vs");
    assert_eq!(m.workers, vec![(b"w".to_vec(), w.options_json.clone())]);
    assert_eq!(health(&b.db, T, b"w").await.map(|h| h.versionstamp), Some(vs));

    let (beat, _) = heartbeat(&b.db, &w, TSTAMP).await;
    assert_eq!(beat, Heartbeat::Renewed);
    assert_eq!(membership(&a.db, T).await.vs, vs);
}

/// `remove` clears the member and health keys and bumps `vs` (the
/// removal's commit); the second time it returns false and writes nothing.
pub async fn workers_remove_clears_member_and_health_once(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let ks = ks_of(&a.db);
    let w1 = spec(T, b"w1", b"{}", 15);
    let w2 = spec(T, b"w2", br#"{"stays":1}"#, 15);
    register(&a.db, &w1).await;
    let vs = register(&a.db, &w2).await;

    let (removed, info) = remove(&b.db, T, b"w1").await;
    assert!(removed);
    let removed_vs = stamp_of(&info);
    assert!(removed_vs > vs);
    assert_eq!(raw_get(&a.db, &ks.member(T, b"w1")).await, None);
    assert_eq!(raw_get(&a.db, &ks.health(T, b"w1")).await, None);
    let m = membership(&a.db, T).await;
    assert_eq!(m.vs, removed_vs);
    assert_eq!(m.workers, vec![(b"w2".to_vec(), w2.options_json.clone())], "the other worker stays");
    assert!(health(&a.db, T, b"w2").await.is_some());

    let (again, info) = remove(&a.db, T, b"w1").await;
    assert!(!again, "a second remove finds nothing");
    assert_eq!(info, CommitInfo { version: None, versionstamp: None }, "and writes nothing");
    assert_eq!(membership(&b.db, T).await.vs, removed_vs);

    let (never, info) = remove(&b.db, b"other", b"w1").await;
    assert!(!never);
    assert_eq!(info.version, None);
    assert_eq!(membership(&b.db, b"other").await.vs, [0; 10]);
}

/// `read_membership` returns exactly the registered workers of the type,
/// in id order, with their options bytes as written, through either
/// handle; ids with NUL bytes, 0xff and prefixes of each other included.
pub async fn workers_read_membership_is_exactly_the_registered_set(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(60_000)).into_bytes();
    let workers: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (b"w".to_vec(), b"{}".to_vec()),
        (b"w\x00".to_vec(), br#"{"nul":"\u0000"}"#.to_vec()),
        (b"w\x00\x01".to_vec(), br#"{"a":[1,2,3]}"#.to_vec()),
        (b"w\x01".to_vec(), "{\"unicode\":\"é\"}".as_bytes().to_vec()),
        (b"w\xff".to_vec(), big),
        (b"\xfe\xff not utf-8".to_vec(), br#"{"timeout":15}"#.to_vec()),
        (Vec::new(), br#"{"empty id":true}"#.to_vec()),
    ];
    for (i, (id, options)) in workers.iter().enumerate() {
        let db = if i % 2 == 0 { &a.db } else { &b.db };
        register(db, &spec(T, id, options, 15)).await;
    }
    let expect = sorted(workers.clone());
    for db in [&a.db, &b.db] {
        assert_eq!(membership(db, T).await.workers, expect);
    }
    // Heartbeats do not show up as members; a removal takes exactly one.
    heartbeat(&b.db, &spec(T, b"w", b"{}", 15), TSTAMP).await;
    assert!(remove(&a.db, T, b"w\x00").await.0);
    let rest: Vec<_> = expect.into_iter().filter(|(id, _)| id.as_slice() != b"w\x00").collect();
    assert_eq!(membership(&b.db, T).await.workers, rest);
    assert_eq!(membership(&a.db, T).await.workers, rest);
}

/// Worker types named like the queue's subspaces (`jobs`, `pending`,
/// `active`), the empty type and a type with a NUL byte (whose prefix `a`
/// is another type) each keep their own members, health and `vs`; jobs of
/// the same names do not mix with them either.
pub async fn workers_types_stay_separate(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let ks = ks_of(&a.db);
    let types: [&[u8]; 8] = [b"jobs", b"pending", b"active", b"", b"a\x00b", b"a", b"workers", b"vs"];
    let mut stamps = Vec::new();
    for (i, t) in types.iter().enumerate() {
        let options = format!("{{\"type\":{i}}}").into_bytes();
        stamps.push(register(&a.db, &spec(t, b"w", &options, 15)).await);
    }
    // Jobs of the same names, and a second worker for the type "a".
    for t in &types {
        let job = NewJob { id: b"w".to_vec(), info: info(0), priority: 0 };
        run(&*b.db, TxOptions::write(), |tx| {
            let (ks, job) = (&ks, &job);
            async move { ops::add(&tx, ks, t, job).await }
        })
        .await
        .expect("add commits")
        .expect("job added");
    }
    register(&b.db, &spec(b"a", b"w2", b"{}", 15)).await;
    for (i, t) in types.iter().enumerate() {
        let m = membership(&b.db, t).await;
        let mut expect = vec![(b"w".to_vec(), format!("{{\"type\":{i}}}").into_bytes())];
        if *t == b"a" {
            expect.push((b"w2".to_vec(), b"{}".to_vec()));
        } else {
            assert_eq!(m.vs, stamps[i], "type {t:?}: only its own registers bump its vs");
        }
        assert_eq!(m.workers, expect, "type {t:?}");
        assert!(health(&b.db, t, b"w").await.is_some());
        let pending = run(&*a.db, TxOptions::read(), |tx| {
            let ks = &ks;
            async move { ops::pending_count(&tx, ks, t).await }
        })
        .await
        .expect("count");
        assert_eq!(pending, 1, "type {t:?}: one pending job");
    }
    // Removing from "a" leaves "a\0b" alone, and the other way round.
    assert!(remove(&a.db, b"a", b"w").await.0);
    let m = membership(&a.db, b"a\x00b").await;
    assert_eq!((m.vs, m.workers.len()), (stamps[4], 1));
    assert!(remove(&b.db, b"a\x00b", b"w").await.0);
    assert_eq!(membership(&a.db, b"a").await.workers, vec![(b"w2".to_vec(), b"{}".to_vec())]);
    assert_eq!(membership(&a.db, b"").await.vs, stamps[3]);
}

/// The stored health record of `id`, as a reaper observes it.
async fn observe(db: &Db, worker_type: &[u8], id: &[u8]) -> Vec<u8> {
    raw_get(db, &ks_of(db).health(worker_type, id)).await.expect("a health record")
}

/// `reap` leaves a worker whose heartbeat renewed its record after it was
/// observed, and a worker that is not registered, and writes nothing
/// either way.
pub async fn workers_reap_spares_a_renewed_worker(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let w = spec(T, b"w", b"{}", 1);
    register(&a.db, &w).await;
    let observed = observe(&b.db, T, b"w").await;
    let (beat, _) = heartbeat(&a.db, &w, TSTAMP).await;
    assert_eq!(beat, Heartbeat::Renewed);
    let vs = membership(&b.db, T).await.vs;
    for db in [&a.db, &b.db] {
        let (reaped, info) = reap(db, T, b"w", &observed).await;
        assert!(!reaped, "a heartbeat since the observation: alive");
        assert_eq!(info.versionstamp, None);
    }
    let (reaped, info) = reap(&b.db, T, b"nobody", &observed).await;
    assert!(!reaped);
    assert_eq!(info.version, None);
    let m = membership(&b.db, T).await;
    assert_eq!((m.vs, m.workers.len()), (vs, 1));
}

/// A record still as observed is removed: member, health and the jobs it
/// ran (back to pending), with one bump of the type's `vs`; a second reap
/// of the same observation finds nothing.
pub async fn workers_reap_removes_the_observed_record(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let nb = node(&b.db);
    let ks = ks_of(&a.db);
    register(&a.db, &spec(T, b"silent", b"{}", 1)).await;
    nb.jobs().add(T, b"j", &info(1), 0).await.expect("add");
    let h = accept_now(nb.jobs(), b"silent").await;
    let observed = observe(&a.db, T, b"silent").await;

    let (reaped, info_) = reap(&b.db, T, b"silent", &observed).await;
    assert!(reaped, "unchanged since observed: reaped");
    let m = membership(&a.db, T).await;
    assert_eq!(m.vs, stamp_of(&info_), "the reap bumps vs");
    assert!(m.workers.is_empty());
    assert_eq!(raw_get(&a.db, &ks.health(T, b"silent")).await, None);
    assert_eq!(nb.jobs().get(T, b"j").await.map(|j| j.state), Ok(JobState::Pending), "its job went back");
    assert_eq!(nb.jobs().finish(&h.fence(), b"{}").await, Err(Error::NotOwner));
    assert!(!reap(&a.db, T, b"silent", &observed).await.0, "reaped once");
    nb.stop().await;
}

/// A record of another incarnation (the id registered again, here or on
/// another node) is another record: the reap of the old observation
/// leaves it, and its jobs, alone. A record no version of this code
/// wrote is removed when it is still the one observed (it would otherwise
/// stay in the membership forever).
pub async fn workers_reap_leaves_another_incarnation(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let nb = node(&b.db);
    let ks = ks_of(&a.db);
    let w = spec(T, b"w", b"{}", 1);
    register_as(&a.db, &w, &[1; 16]).await;
    let observed = observe(&a.db, T, b"w").await;
    let vs = register_as(&b.db, &w, &[2; 16]).await;
    nb.jobs().add(T, b"j", &info(1), 0).await.expect("add");
    let h = accept_now(nb.jobs(), b"w").await;

    let (reaped, info_) = reap(&a.db, T, b"w", &observed).await;
    assert!(!reaped, "the observed incarnation is gone");
    assert_eq!(info_.versionstamp, None, "nothing written");
    assert_eq!(membership(&a.db, T).await.vs, vs);
    assert_eq!(health(&a.db, T, b"w").await.and_then(|h| h.incarnation), Some([2; 16]));
    nb.jobs().finish(&h.fence(), b"{}").await.expect("the new incarnation still holds its job");

    register(&a.db, &spec(T, b"corrupt", b"{}", 15)).await;
    raw_set(&a.db, &ks.health(T, b"corrupt"), b"\xffnot a health record").await;
    assert!(reap(&b.db, T, b"corrupt", b"\xffnot a health record").await.0, "an unreadable record is removed");
    assert_eq!(raw_get(&a.db, &ks.member(T, b"corrupt")).await, None);
    nb.stop().await;
}

/// Issue 12: a removal made for an old incarnation (a handle whose
/// unregister failed, retried or dropped later) finds a newer one and
/// leaves it alone: member, health, membership `vs` and the jobs it runs.
/// The newer one's own removal still works.
pub async fn workers_remove_of_an_old_incarnation_leaves_the_new_one(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let nb = node(&b.db);
    let ks = ks_of(&a.db);
    let (old, new) = ([1u8; 16], [2u8; 16]);
    let w = spec(T, b"w", b"{}", 15);
    register_as(&a.db, &w, &old).await;
    let vs = register_as(&b.db, &w, &new).await;
    nb.jobs().add(T, b"j", &info(1), 0).await.expect("add");
    let h = accept_now(nb.jobs(), b"w").await;

    let (removed, info_) = remove_as(&a.db, T, b"w", &old).await;
    assert!(!removed, "the old incarnation is not registered any more");
    assert_eq!(info_, CommitInfo { version: None, versionstamp: None }, "and nothing is written");
    assert_eq!(membership(&b.db, T).await.vs, vs);
    assert_eq!(health(&b.db, T, b"w").await.and_then(|h| h.incarnation), Some(new));
    assert_eq!(range(&a.db, ks.active_range(T, b"w")).await.len(), 1, "its job keeps running");
    nb.jobs().finish(&h.fence(), b"{}").await.expect("the new incarnation's handle still holds the job");

    assert!(remove_as(&b.db, T, b"w", &new).await.0, "the current incarnation removes itself");
    assert!(membership(&a.db, T).await.workers.is_empty());
    nb.stop().await;
}

/// Issue 12: two nodes registering one id must not keep each other alive.
/// A heartbeat of an incarnation that no longer holds the id writes
/// nothing (`Gone`): the holder's record ages as its own heartbeats leave
/// it, so that its node's death is seen.
pub async fn workers_heartbeat_of_an_old_incarnation_renews_nothing(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let w = spec(T, b"w", b"{}", 1);
    register_as(&a.db, &w, &[1; 16]).await;
    register_as(&b.db, &w, &[2; 16]).await;
    let before = health(&a.db, T, b"w").await.expect("health");

    let (beat, info_) = heartbeat_as(&a.db, &w, &[1; 16], TSTAMP + 9).await;
    assert_eq!(beat, Heartbeat::Gone);
    assert_eq!(info_, CommitInfo { version: None, versionstamp: None }, "nothing written");
    assert_eq!(health(&b.db, T, b"w").await, Some(before), "the holder's record is untouched");

    let (beat, _) = heartbeat_as(&b.db, &w, &[2; 16], TSTAMP).await;
    assert_eq!(beat, Heartbeat::Renewed, "the holder's own heartbeat renews it");
}

/// Two handles reap the same dead worker at the same time: exactly one
/// removes it (and bumps `vs`, once); the other finds it gone and writes
/// nothing. With both retry-loop modes (write, and the read hint that
/// takes the embedded store's conflict path).
pub async fn workers_concurrent_reap_removes_once(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let ks = ks_of(&a.db);
    for round in 0..4u8 {
        let id = vec![b'd', b'0' + round];
        register(&a.db, &spec(T, &id, b"{}", 1)).await;
        let observed = observe(&b.db, T, &id).await;
        let before = membership(&a.db, T).await.vs;
        let opts = if round % 2 == 0 { TxOptions::write() } else { TxOptions::read() };
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let tasks: Vec<_> = [a.db.clone(), b.db.clone()]
            .into_iter()
            .map(|db| {
                let (ks, id, barrier, observed) = (ks.clone(), id.clone(), barrier.clone(), observed.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let (ks, id, observed) = (&ks, &id, &observed);
                    run_with_info(&*db, opts, |tx| async move { workers::reap(&tx, ks, T, id, observed).await })
                        .await
                        .expect("reap commits")
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(task.await.expect("reap task"));
        }
        let reaped: Vec<_> = outcomes.iter().filter(|(r, _)| *r).collect();
        assert_eq!(reaped.len(), 1, "round {round}: exactly one reaper removes the worker: {outcomes:?}");
        let spared = outcomes.iter().find(|(r, _)| !*r).expect("one reaper finds it gone");
        assert_eq!(spared.1.versionstamp, None, "round {round}: the other writes nothing");
        let after = membership(&b.db, T).await;
        assert_eq!(after.vs, stamp_of(&reaped[0].1), "round {round}: vs bumped once, by the reap");
        assert!(after.vs > before);
        assert!(after.workers.is_empty());
        assert_eq!(raw_get(&a.db, &ks.health(T, &id)).await, None);
    }
}

// ---- membership watcher path --------------------------------------------

/// The watcher's path: a watch on the type's `vs` armed in the transaction
/// that reads the membership fires on a register, and on a removal, made
/// through the other handle, but not on heartbeats, nor on changes of a
/// type whose name extends this one.
pub async fn membership_watch_fires_on_change_not_on_heartbeat(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let ks = ks_of(&a.db);
    let w1 = spec(T, b"w1", br#"{"n":1}"#, 15);
    let w2 = spec(T, b"w2", br#"{"n":2}"#, 15);
    register(&a.db, &w1).await;

    let (ks, db) = (&ks, &a.db);
    let read_and_watch = || {
        run(&**db, TxOptions::read(), move |tx| async move {
            let m = workers::read_membership(&tx, ks, T).await?;
            Ok((m, tx.watch(&ks.membership_vs(T))))
        })
    };
    let (m0, mut watch) = read_and_watch().await.expect("read and watch");
    assert_eq!(m0.workers, vec![(b"w1".to_vec(), w1.options_json.clone())]);
    // Let the watch settle (FDB registers it with a storage server).
    tokio::time::sleep(Duration::from_millis(20)).await;

    for db in [&b.db, &a.db, &b.db] {
        assert_eq!(heartbeat(db, &w1, TSTAMP).await.0, Heartbeat::Renewed);
    }
    register(&b.db, &spec(b"replicator\x00x", b"w1", b"{}", 15)).await;
    register(&b.db, &spec(b"replicatorx", b"w1", b"{}", 15)).await;
    let early = tokio::time::timeout(Duration::from_millis(300), &mut watch).await;
    assert!(early.is_err(), "heartbeats and other types must not wake the watcher: {early:?}");

    let vs2 = register(&b.db, &w2).await;
    let fired = tokio::time::timeout(Duration::from_secs(2), &mut watch).await;
    assert_eq!(fired, Ok(Ok(())), "a register through the other handle wakes the watcher");
    let (m1, mut watch) = read_and_watch().await.expect("read and watch again");
    assert_eq!(m1.vs, vs2);
    assert!(m1.vs > m0.vs);
    assert_eq!(m1.workers, vec![(b"w1".to_vec(), w1.options_json.clone()), (b"w2".to_vec(), w2.options_json.clone())]);
    tokio::time::sleep(Duration::from_millis(20)).await;

    assert_eq!(heartbeat(&b.db, &w2, TSTAMP).await.0, Heartbeat::Renewed);
    assert!(tokio::time::timeout(Duration::from_millis(200), &mut watch).await.is_err(), "a heartbeat must not wake it");
    assert!(remove(&b.db, T, b"w1").await.0);
    let fired = tokio::time::timeout(Duration::from_secs(2), &mut watch).await;
    assert_eq!(fired, Ok(Ok(())), "a removal through the other handle wakes the watcher");
    let (m2, _watch) = read_and_watch().await.expect("read after removal");
    assert!(m2.vs > m1.vs);
    assert_eq!(m2.workers, vec![(b"w2".to_vec(), w2.options_json.clone())]);
}

// ---- jobs --------------------------------------------------------------

/// `add` writes a pending job that `get` returns through either handle;
/// an id that exists is `AlreadyExists` and changes nothing; the pending
/// count is exact and per type.
pub async fn jobs_add_get_pending_count(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let (na, nb) = (node(&a.db), node(&b.db));
    let ks = ks_of(&a.db);
    assert_eq!(count(na.jobs()).await, 0);
    assert_eq!(na.jobs().get(T, b"j1").await, Err(Error::NotFound));

    na.jobs().add(T, b"j1", br#"{"a":1}"#, 7).await.expect("add");
    let job = nb.jobs().get(T, b"j1").await.expect("get through the other handle");
    assert_eq!((job.job_type.as_slice(), job.id.as_slice()), (T, b"j1".as_slice()));
    assert_eq!((job.state, job.worker.clone(), job.priority), (JobState::Pending, None, 7));
    assert_eq!((job.info.as_slice(), job.result.clone(), job.attempts), (br#"{"a":1}"#.as_slice(), None, 0));
    assert!(!job.cancel_requested);
    assert_ne!(job.vs[..10], [0xff; 10], "a complete versionstamp");
    assert_eq!(na.jobs().get(T, b"j1").await, Ok(job.clone()));

    assert_eq!(nb.jobs().add(T, b"j1", b"{}", 0).await, Err(Error::AlreadyExists));
    assert_eq!(na.jobs().get(T, b"j1").await, Ok(job.clone()), "a refused add changes nothing");
    nb.jobs().add(T, b"j2", b"{}", -1).await.expect("add");
    nb.jobs().add(b"other", b"j1", b"{}", 0).await.expect("the same id in another type");
    for n in [&na, &nb] {
        assert_eq!(count(n.jobs()).await, 2);
        assert_eq!(n.jobs().pending_count(b"other").await, Ok(1));
        assert_eq!(n.jobs().pending_count(b"none").await, Ok(0));
    }
    assert_eq!(range(&a.db, ks.pending_range(T)).await.len(), 2);
    assert!(nb.jobs().get(T, b"j2").await.expect("get").vs > job.vs, "later adds get greater versionstamps");
    na.stop().await;
    nb.stop().await;
}

/// Accepts take jobs lowest priority first (the whole i64 range), first
/// in first out within a priority, whichever handle added or accepts.
pub async fn jobs_priority_then_fifo_across_handles(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let (na, nb) = (node(&a.db), node(&b.db));
    register(&a.db, &spec(T, b"w", b"{}", 15)).await;
    let adds: [(&[u8], i64); 8] = [
        (b"a1", 5),
        (b"b1", -3),
        (b"a2", 5),
        (b"c1", 0),
        (b"b2", -3),
        (b"min", i64::MIN),
        (b"max", i64::MAX),
        (b"c2", 0),
    ];
    for (i, (id, priority)) in adds.iter().enumerate() {
        let n = if i % 2 == 0 { &na } else { &nb };
        n.jobs().add(T, id, &info(i), *priority).await.expect("add");
    }
    assert_eq!(count(na.jobs()).await, adds.len() as u64);
    let expect: [&[u8]; 8] = [b"min", b"b1", b"b2", b"c1", b"c2", b"a1", b"a2", b"max"];
    for (i, id) in expect.iter().enumerate() {
        let n = if i % 2 == 0 { &nb } else { &na };
        let h = accept_now(n.jobs(), b"w").await;
        assert_eq!(h.job.id, *id, "accept {i}");
        let priority = adds.iter().find(|(a, _)| a == id).map(|(_, p)| *p);
        assert_eq!(Some(h.job.priority), priority);
        assert_eq!(count(n.jobs()).await, (adds.len() - i - 1) as u64);
    }
    assert_eq!(na.jobs().accept(T, b"w", Duration::ZERO).await, Err(Error::NotFound), "the queue is empty");
    na.stop().await;
    nb.stop().await;
}

/// Only a registered worker of the job's type takes a job: an unknown
/// worker, a worker of another type and a removed worker get `NotFound`
/// and the job stays pending; a registered one gets it, running, with one
/// attempt, as both handles see it.
pub async fn jobs_accept_needs_a_registered_worker(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let (na, nb) = (node(&a.db), node(&b.db));
    na.jobs().add(T, b"j", &info(1), 0).await.expect("add");
    register(&b.db, &spec(b"other", b"w2", b"{}", 15)).await;
    for worker in [b"ghost".as_slice(), b"w2"] {
        assert_eq!(na.jobs().accept(T, worker, Duration::ZERO).await, Err(Error::NotFound));
        let started = Instant::now();
        assert_eq!(nb.jobs().accept(T, worker, Duration::from_secs(5)).await, Err(Error::NotFound));
        assert!(started.elapsed() < Duration::from_secs(2), "an unregistered worker is refused at once, not at the timeout");
    }
    assert_eq!(nb.jobs().get(T, b"j").await.map(|j| j.state), Ok(JobState::Pending));
    assert_eq!(count(na.jobs()).await, 1);

    register(&b.db, &spec(T, b"w", b"{}", 15)).await;
    let h = accept_now(na.jobs(), b"w").await;
    assert_eq!(h.job.id, b"j");
    assert_eq!((h.job.state, h.job.worker.clone(), h.job.attempts), (JobState::Running, Some(b"w".to_vec()), 1));
    assert_eq!(nb.jobs().get(T, b"j").await, Ok(h.job.clone()), "the handle's job is the stored one");
    assert_eq!(count(nb.jobs()).await, 0);
    assert_eq!(nb.jobs().accept(T, b"w", Duration::ZERO).await, Err(Error::NotFound), "nothing left");

    assert!(remove(&a.db, T, b"w").await.0);
    nb.jobs().add(T, b"k", b"{}", 0).await.expect("add");
    assert_eq!(na.jobs().accept(T, b"w", Duration::ZERO).await, Err(Error::NotFound), "a removed worker takes nothing");
    assert_eq!(nb.jobs().get(T, b"k").await.map(|j| j.state), Ok(JobState::Pending));
    na.stop().await;
    nb.stop().await;
}

/// `update` and `finish` are fenced by the accept: a handle with another
/// token or worker is `NotOwner`, so is the handle once the job is
/// finished or has left the worker, also after the same worker took the
/// job again.
pub async fn jobs_update_finish_fencing(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let (na, nb) = (node(&a.db), node(&b.db));
    register(&a.db, &spec(T, b"w", b"{}", 15)).await;
    na.jobs().add(T, b"j", &info(0), 0).await.expect("add");
    let h = accept_now(na.jobs(), b"w").await;

    let h1 = nb.jobs().update(&h.fence(), br#"{"progress":50}"#).await.expect("update through the other handle");
    assert_eq!(h1.token, h.token);
    assert_eq!(h1.job.info, br#"{"progress":50}"#);
    assert!(h1.job.vs > h.job.vs);
    assert_eq!(na.jobs().get(T, b"j").await, Ok(h1.job.clone()));

    let stale_token = Fence { token: { let mut t = h.token; t[0] ^= 1; t }, ..h.fence() };
    let other_worker = Fence { worker: b"w2".to_vec(), ..h.fence() };
    for f in [&stale_token, &other_worker] {
        assert_eq!(na.jobs().update(f, b"{}").await, Err(Error::NotOwner));
        assert_eq!(nb.jobs().finish(f, b"{}").await, Err(Error::NotOwner));
    }
    assert_eq!(nb.jobs().get(T, b"j").await, Ok(h1.job.clone()), "refused calls change nothing");

    na.jobs().finish(&h1.fence(), br#"{"done":1}"#).await.expect("finish");
    let done = nb.jobs().get(T, b"j").await.expect("get");
    assert_eq!((done.state, done.worker.clone()), (JobState::Finished, None));
    assert_eq!(done.result.as_deref(), Some(br#"{"done":1}"#.as_slice()));
    assert_eq!(done.info, br#"{"progress":50}"#);
    assert_eq!(nb.jobs().update(&h.fence(), b"{}").await, Err(Error::NotOwner));
    assert_eq!(nb.jobs().finish(&h.fence(), b"{}").await, Err(Error::NotOwner));
    assert_eq!(count(na.jobs()).await, 0);

    // Failover, then the same worker takes the job again: the first
    // accept's handle stays refused.
    nb.jobs().add(T, b"k", &info(1), 0).await.expect("add");
    let hk = accept_now(nb.jobs(), b"w").await;
    assert!(remove(&b.db, T, b"w").await.0);
    register(&a.db, &spec(T, b"w", b"{}", 15)).await;
    let hk2 = accept_now(na.jobs(), b"w").await;
    assert_eq!((hk2.job.id.as_slice(), hk2.job.attempts), (b"k".as_slice(), 2));
    assert_eq!(nb.jobs().update(&hk.fence(), b"{}").await, Err(Error::NotOwner));
    assert_eq!(na.jobs().finish(&hk.fence(), b"{}").await, Err(Error::NotOwner));
    nb.jobs().finish(&hk2.fence(), b"{}").await.expect("the current handle finishes");
    na.stop().await;
    nb.stop().await;
}

/// Cancel: a pending job is canceled at once (out of the queue, count
/// down); a running one gets a request that its worker's next update
/// turns into `Canceled`, while a finish before that still finishes it;
/// on a finished or canceled job it is `Ok` and changes nothing.
pub async fn jobs_cancel_pending_and_running(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let (na, nb) = (node(&a.db), node(&b.db));
    let ks = ks_of(&a.db);
    register(&a.db, &spec(T, b"w", b"{}", 15)).await;
    assert_eq!(na.jobs().cancel(T, b"nope").await, Err(Error::NotFound));

    na.jobs().add(T, b"p", &info(0), 0).await.expect("add");
    nb.jobs().cancel(T, b"p").await.expect("cancel pending");
    let p = na.jobs().get(T, b"p").await.expect("get");
    assert_eq!(p.state, JobState::Canceled);
    assert_eq!(count(na.jobs()).await, 0);
    assert!(range(&a.db, ks.pending_range(T)).await.is_empty());
    assert_eq!(na.jobs().accept(T, b"w", Duration::ZERO).await, Err(Error::NotFound));
    na.jobs().cancel(T, b"p").await.expect("cancel canceled");
    assert_eq!(nb.jobs().get(T, b"p").await, Ok(p));

    na.jobs().add(T, b"r", &info(1), 0).await.expect("add");
    let h = accept_now(na.jobs(), b"w").await;
    nb.jobs().cancel(T, b"r").await.expect("cancel running");
    let r = na.jobs().get(T, b"r").await.expect("get");
    assert_eq!((r.state, r.cancel_requested), (JobState::Running, true));
    assert_eq!(na.jobs().update(&h.fence(), br#"{"x":1}"#).await, Err(Error::Canceled));
    let r = nb.jobs().get(T, b"r").await.expect("get");
    assert_eq!((r.state, r.worker.clone(), r.info.clone()), (JobState::Canceled, None, info(1)));
    assert!(range(&a.db, ks.active_range(T, b"w")).await.is_empty());
    assert_eq!(nb.jobs().finish(&h.fence(), b"{}").await, Err(Error::NotOwner));

    nb.jobs().add(T, b"f", &info(2), 0).await.expect("add");
    let h = accept_now(nb.jobs(), b"w").await;
    na.jobs().cancel(T, b"f").await.expect("cancel running");
    nb.jobs().finish(&h.fence(), br#"{"done":1}"#).await.expect("a finish before the next update finishes");
    let f = na.jobs().get(T, b"f").await.expect("get");
    assert_eq!(f.state, JobState::Finished);
    nb.jobs().cancel(T, b"f").await.expect("cancel finished");
    assert_eq!(na.jobs().get(T, b"f").await, Ok(f));
    assert_eq!(count(nb.jobs()).await, 0);
    na.stop().await;
    nb.stop().await;
}

/// `remove` takes a job in any state with its index keys; a running job's
/// worker is then refused with `NotFound`; the id can be added again, and
/// the old handle stays refused.
pub async fn jobs_remove_running(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let (na, nb) = (node(&a.db), node(&b.db));
    let ks = ks_of(&a.db);
    register(&a.db, &spec(T, b"w", b"{}", 15)).await;
    na.jobs().add(T, b"j", &info(0), 0).await.expect("add");
    na.jobs().add(T, b"p", &info(1), 0).await.expect("add");
    let h = accept_now(na.jobs(), b"w").await;
    assert_eq!(h.job.id, b"j");

    nb.jobs().remove(T, b"j").await.expect("remove running");
    for n in [&na, &nb] {
        assert_eq!(n.jobs().get(T, b"j").await, Err(Error::NotFound));
    }
    assert!(range(&a.db, ks.active_range(T, b"w")).await.is_empty());
    assert_eq!(na.jobs().update(&h.fence(), b"{}").await, Err(Error::NotFound));
    assert_eq!(nb.jobs().finish(&h.fence(), b"{}").await, Err(Error::NotFound));
    assert_eq!(na.jobs().remove(T, b"j").await, Err(Error::NotFound));
    assert_eq!(count(na.jobs()).await, 1);

    na.jobs().remove(T, b"p").await.expect("remove pending");
    assert_eq!(count(nb.jobs()).await, 0);
    assert!(range(&b.db, ks.pending_range(T)).await.is_empty());

    nb.jobs().add(T, b"j", &info(2), 0).await.expect("the id is free again");
    let h2 = accept_now(nb.jobs(), b"w").await;
    assert_eq!((h2.job.id.as_slice(), h2.job.attempts), (b"j".as_slice(), 1));
    assert_eq!(na.jobs().update(&h.fence(), b"{}").await, Err(Error::NotOwner));
    na.jobs().finish(&h2.fence(), b"{}").await.expect("finish");
    na.stop().await;
    nb.stop().await;
}

/// Failover happens in the transaction that removes the worker: a removal
/// whose transaction fails changes nothing; one that commits (through the
/// other handle) sends the running jobs back to pending, attempts kept,
/// with an exact count and no active keys left, and refuses the old
/// handles. The requeued jobs queue behind the ones already pending.
pub async fn jobs_failover_in_the_removing_transaction(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let (na, nb) = (node(&a.db), node(&b.db));
    let ks = ks_of(&a.db);
    register(&a.db, &spec(T, b"w", b"{}", 15)).await;
    for (i, id) in [b"j1", b"j2", b"j3"].into_iter().enumerate() {
        na.jobs().add(T, id, &info(i), 0).await.expect("add");
    }
    let h1 = accept_now(na.jobs(), b"w").await;
    let h2 = accept_now(nb.jobs(), b"w").await;
    assert_eq!((h1.job.id.as_slice(), h2.job.id.as_slice()), (b"j1".as_slice(), b"j2".as_slice()));
    assert_eq!(count(na.jobs()).await, 1);

    // A removal whose transaction fails: nothing of it is committed.
    let k = &ks;
    let failed = run(&*a.db, TxOptions::write(), |tx| async move {
        assert!(workers::remove(&tx, k, T, b"w", &INC).await?, "registered");
        Err::<(), _>(StoreError::Invalid("abort".into()))
    })
    .await;
    assert_eq!(failed, Err(StoreError::Invalid("abort".into())));
    assert_eq!(nb.jobs().get(T, b"j1").await, Ok(h1.job.clone()));
    assert_eq!(nb.jobs().get(T, b"j2").await, Ok(h2.job.clone()));
    assert_eq!(count(nb.jobs()).await, 1);
    assert_eq!(range(&a.db, ks.active_range(T, b"w")).await.len(), 2);
    assert_eq!(membership(&a.db, T).await.workers.len(), 1);

    let (removed, info_) = remove(&b.db, T, b"w").await;
    assert!(removed);
    assert_eq!(membership(&a.db, T).await.vs, stamp_of(&info_));
    for h in [&h1, &h2] {
        let job = na.jobs().get(T, &h.job.id).await.expect("get");
        assert_eq!((job.state, job.worker.clone(), job.attempts), (JobState::Pending, None, 1));
        assert!(job.vs > h.job.vs);
        assert_eq!(job.vs[..10], stamp_of(&info_), "changed by the removing commit");
        assert_eq!(na.jobs().update(&h.fence(), b"{}").await, Err(Error::NotOwner));
        assert_eq!(nb.jobs().finish(&h.fence(), b"{}").await, Err(Error::NotOwner));
    }
    for n in [&na, &nb] {
        assert_eq!(count(n.jobs()).await, 3, "the count is exact");
    }
    assert_eq!(range(&a.db, ks.pending_range(T)).await.len(), 3);
    assert!(range(&b.db, ks.active_range(T, b"w")).await.is_empty());

    register(&b.db, &spec(T, b"w", b"{}", 15)).await;
    let order: Vec<(Vec<u8>, u64)> = {
        let mut v = Vec::new();
        for n in [&na, &nb, &na] {
            let h = accept_now(n.jobs(), b"w").await;
            v.push((h.job.id, h.job.attempts));
        }
        v
    };
    assert_eq!(order, vec![(b"j3".to_vec(), 1), (b"j1".to_vec(), 2), (b"j2".to_vec(), 2)]);
    assert_eq!(count(na.jobs()).await, 0);
    na.stop().await;
    nb.stop().await;
}

/// `add_many` adds every job or none: an id that exists, or repeats in
/// the batch, refuses the whole batch and names the id; a batch that
/// commits keeps its order within a priority.
pub async fn jobs_add_many_all_or_nothing(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let (na, nb) = (node(&a.db), node(&b.db));
    let new = |id: &[u8], priority: i64| NewJob { id: id.to_vec(), info: info(id.len()), priority };
    na.jobs().add(T, b"x", &info(0), 0).await.expect("add");

    let refused = nb.jobs().add_many(T, &[new(b"a", 0), new(b"x", 0), new(b"b", 0)]).await;
    assert_eq!(refused, Err(AddManyError::AlreadyExists(vec![b"x".to_vec()])));
    let refused = na.jobs().add_many(T, &[new(b"c", 0), new(b"d", 0), new(b"c", 0)]).await;
    assert_eq!(refused, Err(AddManyError::AlreadyExists(vec![b"c".to_vec()])));
    for id in [b"a", b"b", b"c", b"d"] {
        assert_eq!(na.jobs().get(T, id).await, Err(Error::NotFound), "nothing of a refused batch is added");
    }
    assert_eq!(count(nb.jobs()).await, 1);
    nb.jobs().add_many(T, &[]).await.expect("an empty batch");
    assert_eq!(count(na.jobs()).await, 1);

    nb.jobs()
        .add_many(T, &[new(b"c", 0), new(b"a", 0), new(b"neg", -1), new(b"b", 0)])
        .await
        .expect("add_many");
    assert_eq!(count(na.jobs()).await, 5);
    let jobs = [b"c".as_slice(), b"a", b"neg", b"b"];
    let stamps: Vec<_> = {
        let mut v = Vec::new();
        for id in jobs {
            v.push(na.jobs().get(T, id).await.expect("get").vs);
        }
        v
    };
    assert!(stamps.iter().all(|vs| vs[..10] == stamps[0][..10]), "one commit");
    register(&a.db, &spec(T, b"w", b"{}", 15)).await;
    let expect: [&[u8]; 5] = [b"neg", b"x", b"c", b"a", b"b"];
    for (i, id) in expect.iter().enumerate() {
        let n = if i % 2 == 0 { &na } else { &nb };
        assert_eq!(accept_now(n.jobs(), b"w").await.job.id, *id, "accept {i}");
    }
    na.stop().await;
    nb.stop().await;
}

/// An accept that waits on one handle is woken, well before its timeout,
/// by a job added through the other handle.
pub async fn jobs_blocking_accept_woken_by_other_handle(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let (na, nb) = (node(&a.db), node(&b.db));
    register(&a.db, &spec(T, b"w", b"{}", 15)).await;
    let jobs = na.jobs().clone();
    let started = Instant::now();
    let waiter = tokio::spawn(async move { jobs.accept(T, b"w", Duration::from_secs(10)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "nothing to take yet");

    nb.jobs().add(T, b"j", &info(7), 0).await.expect("add through the other handle");
    let h = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("the waiting accept is woken within 2 s of the add")
        .expect("waiter task")
        .expect("the job added through the other handle");
    assert!(started.elapsed() < Duration::from_secs(3), "pushed, not at the timeout");
    assert_eq!(h.job.id, b"j");
    assert_eq!((h.job.state, h.job.worker.clone()), (JobState::Running, Some(b"w".to_vec())));
    assert_eq!(nb.jobs().get(T, b"j").await, Ok(h.job.clone()));
    assert_eq!(count(nb.jobs()).await, 0);
    na.stop().await;
    nb.stop().await;
}


// ---- membership change log ----------------------------------------------

async fn changes_since(db: &Db, worker_type: &[u8], since: &Versionstamp) -> workers::MembershipChanges {
    let ks = &ks_of(db);
    run(&**db, TxOptions::read(), |tx| async move { workers::read_membership_changes(&tx, ks, worker_type, since).await })
        .await
        .expect("read membership changes")
}

/// The change log says exactly what changed after a versionstamp: joins
/// with their current options, leaves, a re-join with new options, and
/// nothing for a heartbeat; several changes of one worker fold into its
/// current state.
pub async fn membership_changes_since_a_versionstamp(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    register(&a.db, &spec(T, b"w1", b"{\"n\":1}", 15)).await;
    let vs1 = register(&a.db, &spec(T, b"w2", b"{\"n\":2}", 15)).await;
    let none = changes_since(&b.db, T, &vs1).await;
    assert!(none.complete && none.changes.is_empty() && none.vs == vs1, "{none:?}");
    heartbeat(&b.db, &spec(T, b"w1", b"{\"n\":1}", 15), TSTAMP).await;
    assert!(changes_since(&a.db, T, &vs1).await.changes.is_empty(), "a heartbeat is no change");
    register(&b.db, &spec(T, b"w3", b"{\"n\":3}", 15)).await;
    remove(&a.db, T, b"w1").await;
    register(&b.db, &spec(T, b"w2", b"{\"n\":22}", 15)).await;
    register(&a.db, &spec(T, b"w4", b"{}", 15)).await;
    let vs2 = remove(&b.db, T, b"w4").await.1;
    let got = changes_since(&a.db, T, &vs1).await;
    assert!(got.complete, "{got:?}");
    assert_eq!(got.vs, stamp_of(&vs2));
    let expect: Vec<(Vec<u8>, Option<Vec<u8>>)> = vec![
        (b"w1".to_vec(), None),
        (b"w2".to_vec(), Some(b"{\"n\":22}".to_vec())),
        (b"w3".to_vec(), Some(b"{\"n\":3}".to_vec())),
        (b"w4".to_vec(), None),
    ];
    let mut changes = got.changes.clone();
    changes.sort();
    assert_eq!(changes, expect);
    // Other types' changes are not in this type's log.
    register(&a.db, &spec(b"other", b"x", b"{}", 15)).await;
    assert_eq!(changes_since(&a.db, T, &stamp_of(&vs2)).await.changes, vec![]);
}

/// When the log no longer reaches back to the versionstamp (entries
/// trimmed), the answer says so, and the caller reads everything.
pub async fn membership_changes_incomplete_when_log_trimmed(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let vs1 = register(&a.db, &spec(T, b"w1", b"{}", 15)).await;
    register(&a.db, &spec(T, b"w2", b"{}", 15)).await;
    register(&a.db, &spec(T, b"w3", b"{}", 15)).await;
    // Trim every entry but the last, as 60 s of age would: clear them and
    // raise the floor to the last entry's version.
    let ks = ks_of(&a.db);
    let log = range(&a.db, ks.membership_log_range(T)).await;
    assert_eq!(log.len(), 3, "one log entry per change");
    let (begin, _) = ks.membership_log_range(T);
    let last = log[2].0.clone();
    let Some(crate::keyspace::WorkerKey::Log { vs: last_vs, .. }) = ks.parse_worker_key(&last) else {
        panic!("a log key")
    };
    let floor = ks.membership_log_floor(T);
    let floor_version = crate::keyspace::version_of(&last_vs).to_be_bytes();
    run(&*a.db, TxOptions::write(), |tx| {
        let (begin, last, floor) = (begin.clone(), last.clone(), floor.clone());
        async move {
            tx.clear_range(&begin, &last);
            tx.set(&floor, &floor_version);
            Ok(())
        }
    })
    .await
    .expect("trim");
    // Reading from the last entry on is still complete.
    let from_last = changes_since(&a.db, T, &last_vs).await;
    assert!(from_last.complete && from_last.changes.is_empty(), "{from_last:?}");
    let got = changes_since(&a.db, T, &vs1).await;
    assert!(!got.complete, "a gap in the log must be reported: {got:?}");
}

/// A watcher fed by the change log delivers, after each change, exactly
/// what a full read returns, with 200 members and changes made through a
/// second handle.
pub async fn membership_watcher_incremental_matches_full_reads(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    for i in 0..200u32 {
        register(&b.db, &spec(T, format!("m{i:03}").as_bytes(), format!("{{\"i\":{i}}}").as_bytes(), 15)).await;
    }
    let n = node(&a.db);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Membership>();
    let _watch = n
        .watch_membership(T.to_vec(), Box::new(move |m| {
            let _ = tx.send(m);
        }))
        .expect("watch");
    let first = next_delivery(&mut rx).await;
    assert_eq!(first.workers.len(), 200);
    let steps: Vec<(&[u8], bool)> = vec![(b"new1", true), (b"m007", false), (b"m100", true), (b"new2", true), (b"new1", false)];
    for (id, join) in steps {
        if join {
            register(&b.db, &spec(T, id, b"{\"again\":true}", 15)).await;
        } else {
            remove(&b.db, T, id).await;
        }
        // Deliveries may fold changes; wait until the watcher has caught up
        // with this one, then compare with a full read.
        let full = membership(&b.db, T).await;
        let mut got = next_delivery(&mut rx).await;
        while got.vs < full.vs {
            got = next_delivery(&mut rx).await;
        }
        assert_eq!(got.vs, full.vs);
        assert_eq!(got.workers, full.workers, "after {} {}", if join { "join" } else { "leave" }, String::from_utf8_lossy(id));
    }
    n.stop().await;
}

async fn next_delivery(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Membership>) -> Membership {
    tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("a delivery in 5 s").expect("watcher open")
}
