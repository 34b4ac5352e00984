//! The job queue's calls, one node, embedded store: add/get/remove,
//! add_many, accept and finish, update, cancel, remove while running,
//! order, exact counts, isolation, limits. (couch_jobs_tests.erl's
//! behaviours, on this API.)

mod jobs_common;

use std::time::Duration;

use couch_workers_core::jobs::{AddManyError, Fence, JobState, NewJob};
use couch_workers_core::store::{StoreError, MAX_VALUE_SIZE};
use couch_workers_core::Error;
use jobs_common::*;

const T: &[u8] = b"indexer";

async fn add_get_remove(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    jobs.add(T, b"j1", br#"{"a":1}"#, 7).await.unwrap();
    let job = get(jobs, T, b"j1").await;
    assert_eq!(job.job_type, T);
    assert_eq!(job.id, b"j1");
    assert_eq!(job.state, JobState::Pending);
    assert_eq!(job.worker, None);
    assert_eq!(job.priority, 7);
    assert_eq!(job.info, br#"{"a":1}"#);
    assert_eq!(job.result, None);
    assert_eq!(job.attempts, 0);
    assert!(!job.cancel_requested);
    assert_ne!(job.vs[..10], [0xff; 10], "a complete versionstamp");

    assert_eq!(jobs.add(T, b"j1", b"{}", 0).await, Err(Error::AlreadyExists));
    assert_eq!(get(jobs, T, b"j1").await, job, "a refused add changes nothing");
    assert_eq!(jobs.pending_count(T).await.unwrap(), 1);

    jobs.remove(T, b"j1").await.unwrap();
    assert_eq!(jobs.get(T, b"j1").await, Err(Error::NotFound));
    assert_eq!(jobs.remove(T, b"j1").await, Err(Error::NotFound));
    assert_eq!(jobs.pending_count(T).await.unwrap(), 0);
    assert_eq!(pending_keys(&node, T).await, 0);

    // The id can be used again once removed.
    jobs.add(T, b"j1", b"{}", 0).await.unwrap();
    let again = get(jobs, T, b"j1").await;
    assert!(again.vs > job.vs);
    node.stop().await;
}

async fn add_many_is_all_or_nothing(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let batch: Vec<NewJob> =
        (0..10).map(|i| NewJob { id: format!("m{i}").into_bytes(), info: info(i), priority: 0 }).collect();
    jobs.add_many(T, &batch).await.unwrap();
    assert_eq!(jobs.pending_count(T).await.unwrap(), 10);
    assert_eq!(jobs.add_many(T, &[]).await, Ok(()));

    // m3 and m7 exist: nothing of this batch is added.
    let mixed = vec![
        NewJob { id: b"new1".to_vec(), info: info(0), priority: 0 },
        NewJob { id: b"m3".to_vec(), info: info(0), priority: 0 },
        NewJob { id: b"new2".to_vec(), info: info(0), priority: 0 },
        NewJob { id: b"m7".to_vec(), info: info(0), priority: 0 },
    ];
    assert_eq!(jobs.add_many(T, &mixed).await, Err(AddManyError::AlreadyExists(vec![b"m3".to_vec(), b"m7".to_vec()])));
    assert_eq!(jobs.get(T, b"new1").await, Err(Error::NotFound));
    assert_eq!(jobs.pending_count(T).await.unwrap(), 10);

    // An id twice in one batch: the second finds the first.
    let twice = vec![
        NewJob { id: b"d".to_vec(), info: info(0), priority: 0 },
        NewJob { id: b"d".to_vec(), info: info(1), priority: 0 },
    ];
    assert_eq!(jobs.add_many(T, &twice).await, Err(AddManyError::AlreadyExists(vec![b"d".to_vec()])));
    assert_eq!(jobs.get(T, b"d").await, Err(Error::NotFound));

    // The jobs of one batch run in the batch's order.
    let _w = register(&node, T, b"w").await;
    for i in 0..10 {
        let h = accept_now(jobs, T, b"w").await;
        assert_eq!(h.job.id, format!("m{i}").into_bytes());
        assert_eq!(h.job.info, info(i));
    }
    node.stop().await;
}

async fn accept_and_finish(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    // Not registered: not_found, even with a job waiting.
    add(jobs, T, b"j", 0).await;
    assert_eq!(jobs.accept(T, b"w", Duration::ZERO).await, Err(Error::NotFound));
    assert_eq!(jobs.accept(T, b"w", Duration::from_millis(50)).await, Err(Error::NotFound));
    assert_eq!(get(jobs, T, b"j").await.state, JobState::Pending);

    let _w = register(&node, T, b"w").await;
    let before = get(jobs, T, b"j").await;
    let h = accept_now(jobs, T, b"w").await;
    assert_eq!(h.job.state, JobState::Running);
    assert_eq!(h.job.worker.as_deref(), Some(&b"w"[..]));
    assert_eq!(h.job.attempts, 1);
    assert!(h.job.vs > before.vs);
    assert_eq!(get(jobs, T, b"j").await, h.job, "the handle's job is the stored job");
    assert_eq!(active_keys(&node, T, b"w").await, 1);
    assert_eq!(jobs.pending_count(T).await.unwrap(), 0);
    assert_eq!(jobs.accept(T, b"w", Duration::ZERO).await, Err(Error::NotFound), "nothing left");

    jobs.finish(&h.fence(), br#"{"ok":true}"#).await.unwrap();
    let done = get(jobs, T, b"j").await;
    assert_eq!(done.state, JobState::Finished);
    assert_eq!(done.result.as_deref(), Some(&br#"{"ok":true}"#[..]));
    assert_eq!(done.worker, None);
    assert_eq!(done.attempts, 1);
    assert!(done.vs > h.job.vs);
    assert_eq!(active_keys(&node, T, b"w").await, 0);

    // The handle is spent.
    assert_eq!(jobs.finish(&h.fence(), b"{}").await, Err(Error::NotOwner));
    assert_eq!(jobs.update(&h.fence(), b"{}").await, Err(Error::NotOwner));
    // A forged token is refused.
    let h2_job = {
        add(jobs, T, b"k", 0).await;
        accept_now(jobs, T, b"w").await
    };
    let mut forged = h2_job.fence();
    forged.token[0] ^= 1;
    assert_eq!(jobs.update(&forged, b"{}").await, Err(Error::NotOwner));
    let mut other_worker = h2_job.fence();
    other_worker.worker = b"x".to_vec();
    assert_eq!(jobs.finish(&other_worker, b"{}").await, Err(Error::NotOwner));
    node.stop().await;
}

async fn update_replaces_info(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let _w = register(&node, T, b"w").await;
    add(jobs, T, b"j", 0).await;
    let h = accept_now(jobs, T, b"w").await;
    let h2 = jobs.update(&h.fence(), br#"{"progress":50}"#).await.unwrap();
    assert_eq!(h2.job.info, br#"{"progress":50}"#);
    assert_eq!(h2.job.state, JobState::Running);
    assert_eq!(h2.token, h.token, "the same accept");
    assert!(h2.job.vs > h.job.vs);
    assert_eq!(get(jobs, T, b"j").await, h2.job);
    let h3 = jobs.update(&h2.fence(), br#"{"progress":90}"#).await.unwrap();
    assert!(h3.job.vs > h2.job.vs);
    // A too large info is refused and changes nothing.
    let big = vec![b'x'; MAX_VALUE_SIZE];
    assert_eq!(jobs.update(&h3.fence(), &big).await, Err(Error::Store(StoreError::ValueTooLarge)));
    assert_eq!(get(jobs, T, b"j").await, h3.job);
    jobs.finish(&h3.fence(), b"{}").await.unwrap();
    assert_eq!(get(jobs, T, b"j").await.info, br#"{"progress":90}"#);
    node.stop().await;
}

async fn cancel_pending_and_running(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let _w = register(&node, T, b"w").await;
    assert_eq!(jobs.cancel(T, b"nope").await, Err(Error::NotFound));

    // Pending: canceled at once, out of the queue.
    add(jobs, T, b"p", 0).await;
    jobs.cancel(T, b"p").await.unwrap();
    let p = get(jobs, T, b"p").await;
    assert_eq!(p.state, JobState::Canceled);
    assert_eq!(jobs.pending_count(T).await.unwrap(), 0);
    assert_eq!(pending_keys(&node, T).await, 0);
    assert_eq!(jobs.accept(T, b"w", Duration::ZERO).await, Err(Error::NotFound));
    // Canceled: ok, unchanged.
    jobs.cancel(T, b"p").await.unwrap();
    assert_eq!(get(jobs, T, b"p").await, p);

    // Running: a request; the next update cancels it.
    add(jobs, T, b"r", 0).await;
    let h = accept_now(jobs, T, b"w").await;
    jobs.cancel(T, b"r").await.unwrap();
    let r = get(jobs, T, b"r").await;
    assert_eq!(r.state, JobState::Running);
    assert!(r.cancel_requested);
    jobs.cancel(T, b"r").await.unwrap();
    assert_eq!(get(jobs, T, b"r").await, r, "a second request changes nothing");
    assert_eq!(jobs.update(&h.fence(), br#"{"x":1}"#).await, Err(Error::Canceled));
    let r = get(jobs, T, b"r").await;
    assert_eq!(r.state, JobState::Canceled);
    assert_eq!(r.worker, None);
    assert_eq!(r.info, info(0), "the refused update's info is not stored");
    assert_eq!(active_keys(&node, T, b"w").await, 0);
    assert_eq!(jobs.update(&h.fence(), b"{}").await, Err(Error::NotOwner));
    assert_eq!(jobs.finish(&h.fence(), b"{}").await, Err(Error::NotOwner));

    // Running with a request: finish still finishes it.
    add(jobs, T, b"f", 0).await;
    let h = accept_now(jobs, T, b"w").await;
    jobs.cancel(T, b"f").await.unwrap();
    jobs.finish(&h.fence(), br#"{"done":1}"#).await.unwrap();
    let f = get(jobs, T, b"f").await;
    assert_eq!(f.state, JobState::Finished);
    // Finished: ok, unchanged.
    jobs.cancel(T, b"f").await.unwrap();
    assert_eq!(get(jobs, T, b"f").await, f);
    node.stop().await;
}

async fn remove_running_job_refuses_its_worker(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let _w = register(&node, T, b"w").await;
    add(jobs, T, b"j", 0).await;
    let h = accept_now(jobs, T, b"w").await;
    jobs.remove(T, b"j").await.unwrap();
    assert_eq!(active_keys(&node, T, b"w").await, 0);
    assert_eq!(jobs.update(&h.fence(), b"{}").await, Err(Error::NotFound));
    assert_eq!(jobs.finish(&h.fence(), b"{}").await, Err(Error::NotFound));
    // Re-added under the same id: the old handle is still refused.
    add(jobs, T, b"j", 0).await;
    let h2 = accept_now(jobs, T, b"w").await;
    assert_eq!(jobs.update(&h.fence(), b"{}").await, Err(Error::NotOwner));
    jobs.finish(&h2.fence(), b"{}").await.unwrap();
    node.stop().await;
}

async fn priority_then_first_in_first_out(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let _w = register(&node, T, b"w").await;
    // (id, priority), added in this order.
    let added: Vec<(&[u8], i64)> = vec![
        (b"a", 0),
        (b"b", i64::MAX),
        (b"c", -5),
        (b"d", 0),
        (b"e", i64::MIN),
        (b"f", -5),
        (b"g", 1),
        (b"h", i64::MIN),
        (b"i", 0),
        (b"j", i64::MAX),
        (b"k", -1),
    ];
    for (id, p) in &added {
        add(jobs, T, id, *p).await;
    }
    // One add_many in between: its jobs keep their batch order.
    jobs.add_many(
        T,
        &[
            NewJob { id: b"z1".to_vec(), info: info(0), priority: 0 },
            NewJob { id: b"z0".to_vec(), info: info(0), priority: -5 },
            NewJob { id: b"z2".to_vec(), info: info(0), priority: 0 },
        ],
    )
    .await
    .unwrap();
    let expected: Vec<&[u8]> =
        vec![b"e", b"h", b"c", b"f", b"z0", b"k", b"a", b"d", b"i", b"z1", b"z2", b"g", b"b", b"j"];
    let mut got = Vec::new();
    while let Ok(h) = jobs.accept(T, b"w", Duration::ZERO).await {
        got.push(h.job.id.clone());
    }
    let expected: Vec<Vec<u8>> = expected.into_iter().map(<[u8]>::to_vec).collect();
    assert_eq!(got, expected);
    node.stop().await;
}

async fn counts_are_exact_through_every_transition(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let count = || async { jobs.pending_count(T).await.unwrap() };
    assert_eq!(count().await, 0);
    for i in 0..5 {
        add(jobs, T, format!("j{i}").as_bytes(), 0).await;
    }
    assert_eq!(count().await, 5);
    let _ = jobs.add(T, b"j0", b"{}", 0).await;
    assert_eq!(count().await, 5, "a refused add");
    jobs.add_many(T, &[NewJob { id: b"m".to_vec(), info: info(0), priority: 0 }]).await.unwrap();
    assert_eq!(count().await, 6);
    let reg = register(&node, T, b"w").await;
    let h0 = accept_now(jobs, T, b"w").await;
    let h1 = accept_now(jobs, T, b"w").await;
    assert_eq!(count().await, 4);
    jobs.cancel(T, b"j2").await.unwrap();
    assert_eq!(count().await, 3, "cancel of a pending job");
    jobs.cancel(T, &h1.job.id).await.unwrap();
    assert_eq!(count().await, 3, "cancel request of a running job");
    jobs.remove(T, b"j3").await.unwrap();
    assert_eq!(count().await, 2, "remove of a pending job");
    jobs.remove(T, b"j2").await.unwrap();
    assert_eq!(count().await, 2, "remove of a canceled job");
    // Failover: h0 back to pending, h1 (cancel requested) canceled.
    node.unregister_worker(&reg).await.unwrap();
    assert_eq!(count().await, 3);
    assert_eq!(get(jobs, T, &h0.job.id).await.state, JobState::Pending);
    assert_eq!(get(jobs, T, &h1.job.id).await.state, JobState::Canceled);
    let _w = register(&node, T, b"w").await;
    let h = accept_now(jobs, T, b"w").await;
    assert_eq!(count().await, 2);
    jobs.finish(&h.fence(), b"{}").await.unwrap();
    assert_eq!(count().await, 2, "finish");
    jobs.remove(T, &h.job.id).await.unwrap();
    assert_eq!(count().await, 2, "remove of a finished job");
    assert_eq!(pending_keys(&node, T).await as u64, count().await, "the count is the number of pending keys");
    node.stop().await;
}

async fn types_and_ids_stay_in_their_own_keys(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let ids: Vec<&[u8]> = vec![b"jobs", b"pending", b"active", b"counts", b"", b"a\x00b", b"a", b"\xff\x00\xff"];
    let types: Vec<&[u8]> = vec![b"A", b"B", b"jobs", b"pending", b"", b"A\x00"];
    for (ti, t) in types.iter().enumerate() {
        for (ii, id) in ids.iter().enumerate() {
            jobs.add(t, id, &info(ti * 100 + ii), 0).await.unwrap();
        }
    }
    for (ti, t) in types.iter().enumerate() {
        assert_eq!(jobs.pending_count(t).await.unwrap(), ids.len() as u64);
        for (ii, id) in ids.iter().enumerate() {
            let job = get(jobs, t, id).await;
            assert_eq!((job.job_type.as_slice(), job.id.as_slice()), (*t, *id));
            assert_eq!(job.info, info(ti * 100 + ii));
        }
    }
    // A worker of type A takes only A's jobs, and cannot touch B's.
    let _a = register(&node, b"A", b"w").await;
    let _b = register(&node, b"B", b"w").await;
    let mut taken = Vec::new();
    while let Ok(h) = jobs.accept(b"A", b"w", Duration::ZERO).await {
        assert_eq!(h.job.job_type, b"A");
        taken.push(h);
    }
    assert_eq!(taken.len(), ids.len());
    assert_eq!(jobs.pending_count(b"A").await.unwrap(), 0);
    assert_eq!(jobs.pending_count(b"B").await.unwrap(), ids.len() as u64);
    assert_eq!(jobs.pending_count(b"A\x00").await.unwrap(), ids.len() as u64);
    // A's handle pointed at B's job of the same id.
    let hb = accept_now(jobs, b"B", b"w").await;
    let a_on_b = Fence { job_type: b"B".to_vec(), ..taken.iter().find(|h| h.job.id == hb.job.id).unwrap().fence() };
    assert_eq!(jobs.update(&a_on_b, b"{}").await, Err(Error::NotOwner));
    assert_eq!(jobs.finish(&a_on_b, b"{}").await, Err(Error::NotOwner));
    // B's handle pointed at type A: A's job of that id is A's worker's.
    let b_on_a = Fence { job_type: b"A".to_vec(), ..hb.fence() };
    assert_eq!(jobs.finish(&b_on_a, b"{}").await, Err(Error::NotOwner));
    for h in &taken {
        jobs.finish(&h.fence(), b"{}").await.unwrap();
    }
    jobs.finish(&hb.fence(), b"{}").await.unwrap();
    // A worker of type B with the id of an A worker is not registered as A.
    let _only_b = register(&node, b"B", b"onlyb").await;
    jobs.add(b"A", b"late", b"{}", 0).await.unwrap();
    assert_eq!(jobs.accept(b"A", b"onlyb", Duration::ZERO).await, Err(Error::NotFound));
    node.stop().await;
}

async fn limits_are_refused_with_nothing_written(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let long_id = vec![b'i'; 10_001];
    assert_eq!(jobs.add(T, &long_id, b"{}", 0).await, Err(Error::Store(StoreError::KeyTooLarge)));
    let long_type = vec![b't'; 10_001];
    assert_eq!(jobs.add(&long_type, b"j", b"{}", 0).await, Err(Error::Store(StoreError::KeyTooLarge)));
    assert_eq!(jobs.get(T, &long_id).await, Err(Error::Store(StoreError::KeyTooLarge)));
    let big = vec![b'x'; MAX_VALUE_SIZE];
    assert_eq!(jobs.add(T, b"big", &big, 0).await, Err(Error::Store(StoreError::ValueTooLarge)));
    assert_eq!(jobs.get(T, b"big").await, Err(Error::NotFound));
    // Under the value limit less the room to run for the longest worker
    // id (about 10,000 bytes; tests/jobs_value_room.rs finds the exact
    // largest) is fine.
    let fits = vec![b'x'; MAX_VALUE_SIZE - 11_000];
    jobs.add(T, b"fits", &fits, 0).await.unwrap();
    // A key just at the limit is fine, one byte more is not.
    let base = ks(&node).job(T, b"").len();
    let max_id = vec![b'k'; 10_000 - base - 30];
    jobs.add(T, &max_id, b"{}", 0).await.unwrap();
    // add_many: a bad job refuses the batch; so does a batch over 10 MB.
    let bad = vec![
        NewJob { id: b"ok".to_vec(), info: b"{}".to_vec(), priority: 0 },
        NewJob { id: long_id.clone(), info: b"{}".to_vec(), priority: 0 },
    ];
    assert_eq!(jobs.add_many(T, &bad).await, Err(AddManyError::Error(Error::Store(StoreError::KeyTooLarge))));
    let huge: Vec<NewJob> =
        (0..140).map(|i| NewJob { id: format!("h{i}").into_bytes(), info: vec![b'x'; 80_000], priority: 0 }).collect();
    assert_eq!(jobs.add_many(T, &huge).await, Err(AddManyError::Error(Error::Store(StoreError::TransactionTooLarge))));
    assert_eq!(jobs.get(T, b"ok").await, Err(Error::NotFound));
    assert_eq!(jobs.get(T, b"h0").await, Err(Error::NotFound));
    assert_eq!(jobs.pending_count(T).await.unwrap(), 2);
    // A finish whose result would make the record too large.
    let _w = register(&node, T, b"w").await;
    let h = accept_now(jobs, T, b"w").await;
    assert_eq!(h.job.id, b"fits");
    assert_eq!(jobs.finish(&h.fence(), &vec![b'r'; 12_000]).await, Err(Error::Store(StoreError::ValueTooLarge)));
    assert_eq!(get(jobs, T, b"fits").await.state, JobState::Running);
    jobs.finish(&h.fence(), b"{}").await.unwrap();
    node.stop().await;
}

couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread"),
    stores: [embedded: Embedded],
    tests: [
        add_get_remove,
        add_many_is_all_or_nothing,
        accept_and_finish,
        update_replaces_info,
        cancel_pending_and_running,
        remove_running_job_refuses_its_worker,
        priority_then_first_in_first_out,
        counts_are_exact_through_every_transition,
        types_and_ids_stay_in_their_own_keys,
        limits_are_refused_with_nothing_written,
    ],
);
