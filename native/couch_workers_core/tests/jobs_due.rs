//! A scheduled job that falls due while no acceptor waits for its type
//! (the API's rule: a due job is `pending`): it is listed and counted as
//! pending at once, from the due keys not yet promoted, and every node's
//! promoter moves it to pending in the store within about a second, where
//! the state counters and indexes say so without the due keys.

mod jobs_common;

use std::time::Duration;

use couch_workers_core::jobs::{ops, wall_ms, JobOpts, JobSpec, JobState, Schedule};
use couch_workers_core::keyspace::Keyspace;
use couch_workers_core::store::{run, Db, TxOptions};
use jobs_common::*;

const T: &[u8] = b"t";

fn at(run_at: u64) -> JobOpts {
    JobOpts { schedule: Some(Schedule::RunAt(run_at)), ..JobOpts::default() }
}

fn ids(jobs: &[couch_workers_core::jobs::Job]) -> Vec<&[u8]> {
    jobs.iter().map(|j| j.id.as_slice()).collect()
}

/// On a bare store (no node: nothing promotes), straight through the
/// reads: due jobs read as pending in counts and in pages of pending jobs
/// (in id order, among the pending ones, paged with the rest), and not as
/// scheduled; jobs not due yet stay scheduled.
async fn due_scheduled_jobs_list_and_count_as_pending_before_any_promotion(store: StoreKind) {
    let c = Cluster::on(store);
    let db: Db = c.db();
    let ks = &Keyspace::new(&db.prefix());
    let now = wall_ms();
    let jobs: Vec<JobSpec> = [
        ("a", JobOpts::default()),
        ("b", at(now - 5_000)),
        ("c", at(now + 3_600_000)),
        ("d", JobOpts::default()),
        ("e", at(now - 1)),
        ("f", at(now + 3_600_000)),
    ]
    .into_iter()
    .map(|(id, opts)| JobSpec { id: id.as_bytes().to_vec(), info: b"{}".to_vec(), opts })
    .collect();
    let j = &jobs;
    // Added 10 s ago by the writer's clock: b and e were scheduled then.
    let added = now - 10_000;
    run(db.as_ref(), TxOptions::write(), |tx| async move { ops::add_many_jobs(&tx, ks, T, j, added).await })
        .await
        .expect("add")
        .expect("added");
    let stored =
        run(db.as_ref(), TxOptions::read(), |tx| async move { ops::get(&tx, ks, T, b"b").await }).await.unwrap();
    assert_eq!(stored.map(|j| j.state), Some(JobState::Pending), "b reads as pending");
    let scheduled_keys = run(db.as_ref(), TxOptions::read(), |tx| async move {
        let (begin, end) = ks.scheduled_range(T);
        tx.get_range(&couch_workers_core::store::RangeRequest::new(begin, end)).await
    })
    .await
    .unwrap();
    assert_eq!(scheduled_keys.len(), 4, "b and e are stored as scheduled");
    let read = TxOptions::read();
    let counts = run(db.as_ref(), read, |tx| async move { ops::counts(&tx, ks, T).await }).await.unwrap();
    // scheduled, pending, running, finished, canceled, failed
    assert_eq!(counts, [2, 4, 0, 0, 0, 0]);
    assert_eq!(run(db.as_ref(), read, |tx| async move { ops::pending_count(&tx, ks, T).await }).await.unwrap(), 4);

    let page =
        |states: &'static [JobState], limit: usize, after: Option<&'static [u8]>| {
            let db = db.clone();
            async move {
                run(db.as_ref(), TxOptions::read(), |tx| async move {
                    ops::list(&tx, ks, T, Some(states), limit, after).await
                })
                .await
                .unwrap()
            }
        };
    let (pending, cont) = page(&[JobState::Pending], 10, None).await;
    assert_eq!(ids(&pending), [&b"a"[..], b"b", b"d", b"e"]);
    assert!(pending.iter().all(|j| j.state == JobState::Pending && j.run_at.is_none()));
    assert_eq!(cont, None);
    // Paged: no duplicate, no gap.
    let (first, cont) = page(&[JobState::Pending], 2, None).await;
    assert_eq!(ids(&first), [&b"a"[..], b"b"]);
    assert_eq!(cont.as_deref(), Some(&b"b"[..]));
    let (second, cont) = page(&[JobState::Pending], 2, Some(b"b")).await;
    assert_eq!(ids(&second), [&b"d"[..], b"e"]);
    let (rest, _) = page(&[JobState::Pending], 2, Some(b"e")).await;
    assert!(rest.is_empty(), "{cont:?} {rest:?}");
    let (scheduled, _) = page(&[JobState::Scheduled], 10, None).await;
    assert_eq!(ids(&scheduled), [&b"c"[..], b"f"]);
    let (both, _) = page(&[JobState::Scheduled, JobState::Pending], 10, None).await;
    assert_eq!(ids(&both), [&b"a"[..], b"b", b"c", b"d", b"e", b"f"]);
    db.close();
}

/// With a node running and no worker of the type anywhere: the due job is
/// moved to pending in the store (its state's counter and index), not
/// only read as pending.
async fn a_due_scheduled_job_with_no_waiter_is_promoted_in_the_store(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let due_at = wall_ms() + 200;
    jobs.add_with(T, b"j", b"{}", &at(due_at)).await.unwrap();
    jobs.add_with(T, b"later", b"{}", &at(wall_ms() + 3_600_000)).await.unwrap();
    assert_eq!(get(jobs, T, b"j").await.state, JobState::Scheduled);
    let counter = |state: &'static str| {
        let node = node.clone();
        async move { raw_get(&node, &node.keyspace().state_count(T, state.as_bytes())).await.map(|v| v[..8].to_vec()) }
    };
    assert!(
        eventually(Duration::from_secs(10), || async { pending_keys(&node, T).await == 1 }).await,
        "promoted to the pending index"
    );
    assert!(wall_ms() >= due_at, "never early");
    assert_eq!(counter("pending").await, Some(1i64.to_le_bytes().to_vec()));
    assert_eq!(counter("scheduled").await, Some(1i64.to_le_bytes().to_vec()));
    let stored = range(&node, node.keyspace().scheduled_range(T)).await;
    assert_eq!(stored.len(), 1, "only the later job is left scheduled");
    let counts: Vec<u64> = jobs.counts(T).await.unwrap().iter().map(|(_, n)| *n).collect();
    assert_eq!(counts, [1, 1, 0, 0, 0, 0]);
    node.stop().await;
}

couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread"),
    stores: [embedded: Embedded],
    tests: [
        due_scheduled_jobs_list_and_count_as_pending_before_any_promotion,
        a_due_scheduled_job_with_no_waiter_is_promoted_in_the_store,
    ],
);
