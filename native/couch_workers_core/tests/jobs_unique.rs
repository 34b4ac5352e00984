//! Unique keys (`unique` of `job_add/4`, `job_add_many/2`,
//! `job_resubmit/4`): a duplicate among unended jobs is refused with the
//! holder's id and writes nothing; the key is free again the moment the
//! holder finishes, fails, is canceled, removed or lost with its worker;
//! two nodes adding one key at once: exactly one wins. On every store.

mod jobs_common;

use couch_workers_core::jobs::{requeue_worker_jobs, Departure, JobOpts, JobSpec, JobState, MaxAttempts, Retry};
use couch_workers_core::store::{run, TxOptions};
use couch_workers_core::{AddManyError, Error};
use jobs_common::*;

const T: &[u8] = b"replication";

fn unique(key: &[u8]) -> JobOpts {
    JobOpts { unique: Some(key.to_vec()), ..JobOpts::default() }
}

fn spec(id: &[u8], key: Option<&[u8]>) -> JobSpec {
    JobSpec {
        id: id.to_vec(),
        info: b"{}".to_vec(),
        opts: JobOpts { unique: key.map(<[u8]>::to_vec), ..JobOpts::default() },
    }
}

fn dup(holder: &[u8]) -> Error {
    Error::Duplicate(holder.to_vec())
}

/// Every key of the key space but the reaper's pulse, in one snapshot:
/// what a refused call must leave as it was. (Each reaper pass adds to
/// the pulse, whenever it runs: a pass between two snapshots failed this
/// test on FoundationDB.)
async fn snapshot(node: &couch_workers_core::Node) -> Vec<(Vec<u8>, Vec<u8>)> {
    let pulse = ks(node).reaper_pulse();
    range(node, ks(node).root_range()).await.into_iter().filter(|(k, _)| *k != pulse).collect()
}

/// Whether another job could take `key` now: adds one with it (then
/// removes it again), or answers the refusal. A key free to take is gone
/// from the store too: its ended holder gave it up in its last write.
async fn free(node: &couch_workers_core::Node, key: &[u8]) -> Result<(), Error> {
    let left = raw_get(node, &ks(node).unique(T, key)).await;
    let id = [b"next-", key].concat();
    node.jobs().add_with(T, &id, b"{}", &unique(key)).await?;
    assert_eq!(left, None, "the ended holder left its key behind");
    node.jobs().remove(T, &id).await
}

async fn a_duplicate_is_refused_with_its_holder_and_writes_nothing(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    jobs.add_with(T, b"a", b"{}", &unique(b"db1")).await.unwrap();
    assert_eq!(get(jobs, T, b"a").await.unique.as_deref(), Some(&b"db1"[..]));
    let before = snapshot(&node).await;
    assert_eq!(jobs.add_with(T, b"b", b"{}", &unique(b"db1")).await, Err(dup(b"a")));
    let scheduled = JobOpts { schedule: Some(couch_workers_core::Schedule::Delay(60_000)), ..unique(b"db1") };
    assert_eq!(jobs.add_with(T, b"c", b"{}", &scheduled).await, Err(dup(b"a")));
    assert_eq!(jobs.resubmit(T, b"d", b"{}", &unique(b"db1"), None).await, Err(dup(b"a")));
    assert_eq!(snapshot(&node).await, before, "a refusal writes nothing");
    // The same key in another type, other keys, no key: all free.
    jobs.add_with(b"other", b"b", b"{}", &unique(b"db1")).await.unwrap();
    jobs.add_with(T, b"b", b"{}", &unique(b"db1\0")).await.unwrap();
    jobs.add_with(T, b"e", b"{}", &JobOpts::default()).await.unwrap();
    assert_eq!(get(jobs, T, b"e").await.unique, None);
    // The holder itself, added again: it exists (its own key is no duplicate).
    assert_eq!(jobs.add_with(T, b"a", b"{}", &unique(b"db1")).await, Err(Error::AlreadyExists));
    // A key over the key limit is refused before anything is read.
    let huge = unique(&vec![b'k'; 20_000]);
    assert_eq!(
        jobs.add_with(T, b"f", b"{}", &huge).await,
        Err(Error::Store(couch_workers_core::store::StoreError::KeyTooLarge))
    );
    node.stop().await;
}

/// The key goes with each way a job ends: finished, failed (no retry
/// left), canceled (queued, and running at its worker's next update),
/// removed (queued and running), lost with its worker; a retry or a
/// release keeps it.
async fn the_key_is_free_once_the_holder_ends(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let _w = register(&node, T, b"w").await;
    // Finished.
    jobs.add_with(T, b"a", b"{}", &unique(b"k1")).await.unwrap();
    let h = accept_now(jobs, T, b"w").await;
    assert_eq!(free(&node, b"k1").await, Err(dup(b"a")), "running holds it");
    jobs.finish(&h.fence(), b"{}").await.unwrap();
    free(&node, b"k1").await.unwrap();
    // Failed: a retry keeps it, the last failure frees it.
    let once = JobOpts { max_attempts: Some(MaxAttempts::Limit(2)), ..unique(b"k2") };
    jobs.add_with(T, b"b", b"{}", &once).await.unwrap();
    let h = accept_now(jobs, T, b"w").await;
    jobs.fail(&h.fence(), b"{}", Retry::After(0)).await.unwrap();
    assert_eq!(get(jobs, T, b"b").await.state, JobState::Pending);
    assert_eq!(free(&node, b"k2").await, Err(dup(b"b")), "a retry keeps it");
    let h = accept_now(jobs, T, b"w").await;
    jobs.release(&h.fence(), &JobOpts::default(), None).await.unwrap();
    assert_eq!(free(&node, b"k2").await, Err(dup(b"b")), "a release keeps it");
    let h = accept_now(jobs, T, b"w").await;
    jobs.fail(&h.fence(), b"{}", Retry::No).await.unwrap();
    assert_eq!(get(jobs, T, b"b").await.state, JobState::Failed);
    free(&node, b"k2").await.unwrap();
    // Canceled while pending; canceled while running (at the update).
    jobs.add_with(T, b"c", b"{}", &unique(b"k3")).await.unwrap();
    jobs.cancel(T, b"c").await.unwrap();
    free(&node, b"k3").await.unwrap();
    jobs.add_with(T, b"d", b"{}", &unique(b"k4")).await.unwrap();
    let h = accept_now(jobs, T, b"w").await;
    jobs.cancel(T, b"d").await.unwrap();
    assert_eq!(free(&node, b"k4").await, Err(dup(b"d")), "a cancel request waits for the worker");
    assert_eq!(jobs.update(&h.fence(), b"{}").await, Err(Error::Canceled));
    free(&node, b"k4").await.unwrap();
    // Removed while pending, and while running.
    jobs.add_with(T, b"e", b"{}", &unique(b"k5")).await.unwrap();
    jobs.remove(T, b"e").await.unwrap();
    free(&node, b"k5").await.unwrap();
    jobs.add_with(T, b"f", b"{}", &unique(b"k6")).await.unwrap();
    let _h = accept_now(jobs, T, b"w").await;
    jobs.remove(T, b"f").await.unwrap();
    free(&node, b"k6").await.unwrap();
    // Lost with its worker, its last attempt spent: failed, free.
    let last = JobOpts { max_attempts: Some(MaxAttempts::Limit(1)), ..unique(b"k7") };
    jobs.add_with(T, b"g", b"{}", &last).await.unwrap();
    let _h = accept_now(jobs, T, b"w").await;
    let k = ks(&node);
    run(node.db().as_ref(), TxOptions::write(), |tx| async move {
        requeue_worker_jobs(&tx, k, T, b"w", Departure::Lost).await
    })
    .await
    .unwrap();
    assert_eq!(get(jobs, T, b"g").await.state, JobState::Failed);
    free(&node, b"k7").await.unwrap();
    assert_eq!(range(&node, (k.unique(T, b""), k.unique(T, b"\xff"))).await, vec![], "no key left behind");
    node.stop().await;
}

async fn add_many_is_all_or_nothing_for_unique_keys(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    jobs.add_with(T, b"a", b"{}", &unique(b"k1")).await.unwrap();
    let before = snapshot(&node).await;
    let batch = [spec(b"x", Some(b"k0")), spec(b"y", None), spec(b"z", Some(b"k1"))];
    assert_eq!(jobs.add_many_with(T, &batch).await, Err(AddManyError::Error(dup(b"a"))));
    // Twice in one batch: the second finds the first.
    let batch = [spec(b"x", Some(b"k2")), spec(b"y", Some(b"k2"))];
    assert_eq!(jobs.add_many_with(T, &batch).await, Err(AddManyError::Error(dup(b"x"))));
    assert_eq!(snapshot(&node).await, before, "a refused batch writes nothing");
    let batch = [spec(b"x", Some(b"k2")), spec(b"y", Some(b"k3")), spec(b"z", None)];
    jobs.add_many_with(T, &batch).await.unwrap();
    assert_eq!(jobs.add_with(T, b"w", b"{}", &unique(b"k3")).await, Err(dup(b"y")));
    node.stop().await;
}

/// A resubmit keeps the job's key unless it gives another (the old one is
/// free then); a resubmit that queues an ended job again claims its key
/// anew, and is refused if another job took it meanwhile.
async fn resubmit_keeps_or_moves_the_key(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let _w = register(&node, T, b"w").await;
    jobs.add_with(T, b"a", b"{}", &unique(b"k1")).await.unwrap();
    // Pending, no key given: kept.
    jobs.resubmit(T, b"a", br#"{"n":1}"#, &JobOpts::default(), None).await.unwrap();
    assert_eq!(get(jobs, T, b"a").await.unique.as_deref(), Some(&b"k1"[..]));
    assert_eq!(jobs.add_with(T, b"b", b"{}", &unique(b"k1")).await, Err(dup(b"a")));
    // Pending, another key: moved.
    jobs.resubmit(T, b"a", b"{}", &unique(b"k2"), None).await.unwrap();
    jobs.add_with(T, b"b", b"{}", &unique(b"k1")).await.unwrap();
    assert_eq!(jobs.resubmit(T, b"a", b"{}", &unique(b"k1"), None).await, Err(dup(b"b")));
    assert_eq!(get(jobs, T, b"a").await.unique.as_deref(), Some(&b"k2"[..]), "a refused move keeps the old key");
    // Running, another key: moved at once, and kept when it runs again.
    jobs.remove(T, b"b").await.unwrap();
    let h = accept_now(jobs, T, b"w").await;
    assert_eq!(h.job.id, b"a");
    jobs.resubmit(T, b"a", b"{}", &unique(b"k3"), None).await.unwrap();
    jobs.add_with(T, b"c", b"{}", &unique(b"k2")).await.unwrap();
    assert_eq!(jobs.add_with(T, b"d", b"{}", &unique(b"k3")).await, Err(dup(b"a")));
    jobs.finish(&h.fence(), b"{}").await.unwrap();
    let again = get(jobs, T, b"a").await;
    assert_eq!((again.state, again.unique.as_deref()), (JobState::Pending, Some(&b"k3"[..])));
    assert_eq!(jobs.add_with(T, b"d", b"{}", &unique(b"k3")).await, Err(dup(b"a")));
    // Ended, then queued again: claims its key anew, unless taken.
    jobs.cancel(T, b"a").await.unwrap();
    jobs.add_with(T, b"d", b"{}", &unique(b"k3")).await.unwrap();
    let before = snapshot(&node).await;
    assert_eq!(jobs.resubmit(T, b"a", b"{}", &JobOpts::default(), None).await, Err(dup(b"d")));
    assert_eq!(snapshot(&node).await, before, "a refused resubmit writes nothing");
    jobs.remove(T, b"d").await.unwrap();
    jobs.resubmit(T, b"a", b"{}", &JobOpts::default(), None).await.unwrap();
    assert_eq!(jobs.add_with(T, b"e", b"{}", &unique(b"k3")).await, Err(dup(b"a")));
    node.stop().await;
}

/// Two nodes add jobs of one key at once, many rounds: exactly one wins
/// each round, and the loser names it.
async fn two_nodes_adding_one_key_exactly_one_wins(store: StoreKind) {
    let c = Cluster::on(store);
    let (a, b) = (c.node(), c.node());
    for round in 0..20 {
        let key = format!("key-{round}").into_bytes();
        let (ia, ib) = (format!("a-{round}").into_bytes(), format!("b-{round}").into_bytes());
        let opts = unique(&key);
        let (ra, rb) = tokio::join!(a.jobs().add_with(T, &ia, b"{}", &opts), b.jobs().add_with(T, &ib, b"{}", &opts));
        match (ra, rb) {
            (Ok(()), Err(e)) => assert_eq!(e, dup(&ia), "round {round}"),
            (Err(e), Ok(())) => assert_eq!(e, dup(&ib), "round {round}"),
            other => panic!("round {round}: {other:?}"),
        }
        let added = a.jobs().counts(T).await.unwrap().iter().map(|(_, n)| n).sum::<u64>();
        assert_eq!(added, round as u64 + 1, "round {round}");
    }
    a.stop().await;
    b.stop().await;
}

couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread"),
    stores: [embedded: Embedded, sim: Sim],
    tests: [
        a_duplicate_is_refused_with_its_holder_and_writes_nothing,
        the_key_is_free_once_the_holder_ends,
        add_many_is_all_or_nothing_for_unique_keys,
        resubmit_keeps_or_moves_the_key,
        two_nodes_adding_one_key_exactly_one_wins,
    ],
);
