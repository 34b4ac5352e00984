//! A job's run history: the last 10 runs, newest first, each with its
//! attempt, worker, start and end (wall clock), outcome and error,
//! written by the accept and the run's end in their own transactions
//! (the current or last run in the job's record, the runs before it a key
//! each); a removal takes it away. On every store.

mod jobs_common;

use couch_workers_core::job_controls::{Outcome, Run};
use couch_workers_core::jobs::{requeue_worker_jobs, Departure, JobOpts, JobState, MaxAttempts, Retry};
use couch_workers_core::store::{run, TxOptions};
use couch_workers_core::{Error, JobService};
use jobs_common::*;

const T: &[u8] = b"indexer";

async fn history(jobs: &JobService, id: &[u8]) -> Vec<Run> {
    jobs.get_with_history(T, id).await.expect("the job").1
}

fn outcomes(runs: &[Run]) -> Vec<(u64, Outcome)> {
    runs.iter().map(|r| (r.attempt, r.outcome)).collect()
}

async fn every_outcome_newest_first(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let _w = register(&node, T, b"w1").await;
    let opts = JobOpts { max_attempts: Some(MaxAttempts::Infinity), ..JobOpts::default() };
    jobs.add_with(T, b"a", b"{}", &opts).await.unwrap();
    assert_eq!(history(jobs, b"a").await, vec![], "no run yet");
    let start = couch_workers_core::jobs::wall_ms();
    // Running.
    let h = accept_now(jobs, T, b"w1").await;
    let runs = history(jobs, b"a").await;
    assert_eq!(outcomes(&runs), vec![(1, Outcome::Running)]);
    assert_eq!((runs[0].worker.as_slice(), runs[0].ended_at, &runs[0].error), (&b"w1"[..], None, &None));
    assert!(runs[0].started_at >= start);
    // Retried (with its error), released, lost, then finished.
    jobs.fail(&h.fence(), br#"{"why":"x"}"#, Retry::After(0)).await.unwrap();
    let h = accept_now(jobs, T, b"w1").await;
    jobs.release(&h.fence(), &JobOpts::default(), None).await.unwrap();
    let _h = accept_now(jobs, T, b"w1").await;
    let k = ks(&node);
    run(node.db().as_ref(), TxOptions::write(), |tx| async move {
        requeue_worker_jobs(&tx, k, T, b"w1", Departure::Lost).await
    })
    .await
    .unwrap();
    let h = accept_now(jobs, T, b"w1").await;
    jobs.finish(&h.fence(), b"{}").await.unwrap();
    let runs = history(jobs, b"a").await;
    assert_eq!(
        outcomes(&runs),
        vec![(4, Outcome::Finished), (3, Outcome::Lost), (2, Outcome::Released), (1, Outcome::Retried)]
    );
    assert_eq!(runs[3].error.as_deref(), Some(&br#"{"why":"x"}"#[..]));
    assert_eq!(runs[1].error.as_deref(), Some(&br#"{"reason":"worker_lost"}"#[..]));
    assert_eq!((runs[0].error.as_deref(), runs[2].error.as_deref()), (None, None));
    for r in &runs {
        let ended = r.ended_at.expect("ended");
        assert!(r.started_at <= ended, "{r:?}");
    }
    // Failed (no retry), and canceled at the worker's update.
    jobs.add(T, b"b", b"{}", 0).await.unwrap();
    let h = accept_now(jobs, T, b"w1").await;
    jobs.fail(&h.fence(), b"{}", Retry::No).await.unwrap();
    assert_eq!(outcomes(&history(jobs, b"b").await), vec![(1, Outcome::Failed)]);
    jobs.add(T, b"c", b"{}", 0).await.unwrap();
    let h = accept_now(jobs, T, b"w1").await;
    jobs.cancel(T, b"c").await.unwrap();
    assert_eq!(jobs.update(&h.fence(), b"{}").await, Err(Error::Canceled));
    assert_eq!(outcomes(&history(jobs, b"c").await), vec![(1, Outcome::Canceled)]);
    assert_eq!(get(jobs, T, b"c").await.state, JobState::Canceled);
    node.stop().await;
}

/// Twelve runs keep the last ten; the store holds no more than their keys.
/// A resubmit starts the history again at its first run; a removal
/// clears it.
async fn the_last_ten_runs_and_no_more(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let _w = register(&node, T, b"w").await;
    let opts = JobOpts { max_attempts: Some(MaxAttempts::Infinity), ..JobOpts::default() };
    jobs.add_with(T, b"a", b"{}", &opts).await.unwrap();
    for _ in 0..12 {
        let h = accept_now(jobs, T, b"w").await;
        jobs.fail(&h.fence(), b"{}", Retry::After(0)).await.unwrap();
    }
    let runs = history(jobs, b"a").await;
    assert_eq!(runs.iter().map(|r| r.attempt).collect::<Vec<_>>(), (3..=12).rev().collect::<Vec<u64>>());
    assert!(runs.iter().all(|r| r.outcome == Outcome::Retried));
    assert_eq!(range(&node, ks(&node).history_range(T, b"a")).await.len(), 9, "a key per kept run but the last");
    // A resubmit: attempts start at 0 again, and so does the history.
    let h = accept_now(jobs, T, b"w").await;
    jobs.finish(&h.fence(), b"{}").await.unwrap();
    jobs.resubmit(T, b"a", b"{}", &JobOpts::default(), None).await.unwrap();
    let h = accept_now(jobs, T, b"w").await;
    assert_eq!(h.job.attempts, 1);
    assert_eq!(outcomes(&history(jobs, b"a").await), vec![(1, Outcome::Running)]);
    // Resubmitted while it runs: queued anew at the run's end, from run 1.
    jobs.resubmit(T, b"a", b"{}", &JobOpts::default(), None).await.unwrap();
    jobs.finish(&h.fence(), b"{}").await.unwrap();
    assert_eq!(history(jobs, b"a").await, vec![]);
    let _h = accept_now(jobs, T, b"w").await;
    assert_eq!(outcomes(&history(jobs, b"a").await), vec![(1, Outcome::Running)]);
    assert_eq!(range(&node, ks(&node).history_range(T, b"a")).await.len(), 0, "no key of the life before");
    jobs.remove(T, b"a").await.unwrap();
    assert_eq!(range(&node, ks(&node).history_range(T, b"a")).await, vec![], "a removal clears the history");
    assert_eq!(jobs.get_with_history(T, b"a").await.map(|_| ()), Err(Error::NotFound));
    node.stop().await;
}

/// A job that runs once writes no history key: its run is in its record,
/// from the accept to its end and after. The next accept moves it into a
/// key of its own.
async fn a_single_run_writes_no_key(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let _w = register(&node, T, b"w").await;
    jobs.add_with(T, b"a", b"{}", &JobOpts { max_attempts: Some(MaxAttempts::Infinity), ..JobOpts::default() })
        .await
        .unwrap();
    let keys = || async { range(&node, ks(&node).history_range(T, b"a")).await.len() };
    let h = accept_now(jobs, T, b"w").await;
    assert_eq!((outcomes(&history(jobs, b"a").await), keys().await), (vec![(1, Outcome::Running)], 0));
    jobs.fail(&h.fence(), br#"{"why":"y"}"#, Retry::After(0)).await.unwrap();
    assert_eq!((outcomes(&history(jobs, b"a").await), keys().await), (vec![(1, Outcome::Retried)], 0));
    let h = accept_now(jobs, T, b"w").await;
    assert_eq!(keys().await, 1, "the next accept keeps run 1 in a key");
    jobs.finish(&h.fence(), b"{}").await.unwrap();
    let runs = history(jobs, b"a").await;
    assert_eq!(outcomes(&runs), vec![(2, Outcome::Finished), (1, Outcome::Retried)]);
    assert_eq!(runs[1].error.as_deref(), Some(&br#"{"why":"y"}"#[..]), "the run's failure moved with it");
    assert_eq!((runs[1].worker.as_slice(), runs[1].ended_at.is_some()), (&b"w"[..], true));
    node.stop().await;
}

/// Runs an older version wrote as two keys each, a start (part 0) and an
/// end (part 1), are still read (a start alone: running), and a removal
/// clears them.
async fn runs_in_two_keys_are_still_read(store: StoreKind) {
    use foundationdb_tuple::{pack, Bytes};
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    jobs.add(T, b"a", b"{}", 0).await.unwrap();
    let k = ks(&node);
    run(node.db().as_ref(), TxOptions::write(), |tx| async move {
        tx.set(&k.history_part(T, b"a", 1, 0), &pack(&(1i64, Bytes::from(&b"old"[..]), 1_000i64)));
        let end = (1i64, 2_000i64, Bytes::from(&b"retried"[..]), Some(Bytes::from(&br#"{"e":1}"#[..])));
        tx.set(&k.history_part(T, b"a", 1, 1), &pack(&end));
        tx.set(&k.history_part(T, b"a", 2, 0), &pack(&(1i64, Bytes::from(&b"old"[..]), 3_000i64)));
        Ok(())
    })
    .await
    .unwrap();
    let runs = history(jobs, b"a").await;
    assert_eq!(outcomes(&runs), vec![(2, Outcome::Running), (1, Outcome::Retried)]);
    assert_eq!((runs[1].worker.as_slice(), runs[1].started_at, runs[1].ended_at), (&b"old"[..], 1_000, Some(2_000)));
    assert_eq!(runs[1].error.as_deref(), Some(&br#"{"e":1}"#[..]));
    // A removal clears them too.
    jobs.remove(T, b"a").await.unwrap();
    assert_eq!(range(&node, ks(&node).history_range(T, b"a")).await, vec![]);
    node.stop().await;
}

couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread"),
    stores: [embedded: Embedded, sim: Sim],
    tests: [
        every_outcome_newest_first,
        the_last_ten_runs_and_no_more,
        a_single_run_writes_no_key,
        runs_in_two_keys_are_still_read
    ],
);
