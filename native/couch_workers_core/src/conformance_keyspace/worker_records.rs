//! Worker records: register, heartbeat, remove, reap.

use std::sync::Arc;

use super::helpers::{
    accept_now, count, health, heartbeat, heartbeat_as, info, ks_of, membership, node, range, raw_get, raw_set, reap,
    register, register_as, remove, remove_as, sorted, spec, stamp_of, INC, T, TSTAMP,
};
use crate::conformance::StoreFactory;
use crate::jobs::{ops, JobState, NewJob};
use crate::keyspace::Health;
use crate::roster;
use crate::store::{run, run_attempts, CommitInfo, Db, TxOptions};
use crate::workers::Heartbeat;
use crate::Error;

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
    assert_eq!(
        m.workers,
        vec![(b"w1".to_vec(), w1_again.options_json.clone()), (b"w2".to_vec(), w2.options_json.clone())]
    );
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

    // A remove that finds no record stores nothing: it only writes the
    // record's key (clearing nothing), so that a renewal that read it
    // absent conflicts with it (tests/workers_unregister_race.rs).
    let (again, info) = remove(&a.db, T, b"w1").await;
    assert!(!again, "a second remove finds nothing");
    assert_eq!(info.versionstamp, None, "and bumps no versionstamp");
    assert_eq!(raw_get(&a.db, &ks.health(T, b"w1")).await, None);
    assert_eq!(raw_get(&a.db, &ks.member(T, b"w1")).await, None);
    assert_eq!(membership(&b.db, T).await.vs, removed_vs);

    let (never, info) = remove(&b.db, b"other", b"w1").await;
    assert!(!never);
    assert_eq!(info.versionstamp, None);
    assert_eq!(raw_get(&a.db, &ks.health(b"other", b"w1")).await, None);
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

/// A removal made for an old incarnation (a handle whose
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

/// Two nodes registering one id must not keep each other alive.
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
                    run_attempts(&*db, opts, |tx, _| async move { roster::reap(&tx, ks, T, id, observed).await })
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
