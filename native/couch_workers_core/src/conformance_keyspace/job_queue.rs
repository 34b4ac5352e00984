//! The job queue over two handles: add, accept, fencing, cancel, failover.

use std::time::{Duration, Instant};

use super::helpers::{
    accept_now, count, info, ks_of, membership, node, range, register, remove, spec, stamp_of, INC, T,
};
use crate::conformance::StoreFactory;
use crate::jobs::{AddManyError, Fence, JobState, NewJob};
use crate::roster;
use crate::store::{run, StoreError, TxOptions};
use crate::Error;

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
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "an unregistered worker is refused at once, not at the timeout"
        );
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

    let stale_token = Fence {
        token: {
            let mut t = h.token;
            t[0] ^= 1;
            t
        },
        ..h.fence()
    };
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
        assert!(roster::remove(&tx, k, T, b"w", &INC).await?, "registered");
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

    nb.jobs().add_many(T, &[new(b"c", 0), new(b"a", 0), new(b"neg", -1), new(b"b", 0)]).await.expect("add_many");
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
