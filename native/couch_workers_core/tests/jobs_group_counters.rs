//! The running counters of groups (`max_running_per_group`'s, kept by
//! `jobs/limits.rs`) that run nothing are cleared by the pruners' sweep
//! (`jobs/ops/prune.rs`, `clear_idle_groups`), in batches, without losing
//! a run of the group that starts during the sweep. On every store.

mod jobs_common;

use couch_workers_core::jobs::{ops, JobOpts};
use couch_workers_core::store::{run, StoreError, TxOptions};
use couch_workers_core::Node;
use jobs_common::*;
use std::time::Duration;

const T: &[u8] = b"grouped";

/// A group's running counter, as stored (`None`: no key).
async fn group_counter(node: &Node, group: &str) -> Option<i64> {
    let raw = raw_get(node, &ks(node).group_running(T, group.as_bytes())).await?;
    let mut le = [0u8; 8];
    le[..raw.len().min(8)].copy_from_slice(&raw[..raw.len().min(8)]);
    Some(i64::from_le_bytes(le))
}

/// Adds job `id` of `group`.
async fn add_in(node: &Node, id: &str, group: &str) {
    let opts = JobOpts { group: Some(group.as_bytes().to_vec()), ..JobOpts::default() };
    node.jobs().add_with(T, id.as_bytes(), &info(0), &opts).await.expect("add");
}

/// One sweep of the groups' counters, in a transaction of its own.
async fn sweep(node: &Node, after: Option<&[u8]>, limit: usize) -> ops::GroupsSwept {
    let ks = node.keyspace();
    run(node.db().as_ref(), TxOptions::write(), |tx| async move { ops::clear_idle_groups(&tx, ks, after, limit).await })
        .await
        .expect("sweep")
}

/// Whether a sweep of every counter would find one at 0 (a read).
async fn idle_ahead(node: &Node) -> (bool, Option<Vec<u8>>) {
    let ks = node.keyspace();
    run(node.db().as_ref(), TxOptions::read(), |tx| async move { ops::idle_groups_ahead(&tx, ks, None, 500).await })
        .await
        .expect("look ahead")
}

/// Whether a group's counter is at 0, or cleared already: the test's
/// node's own pruner sweeps at every minute's turn, which may fall
/// anywhere in the test.
fn idle(counter: Option<i64>) -> bool {
    matches!(counter, Some(0) | None)
}

/// A group that runs nothing leaves no counter key behind: a sweep clears
/// the counters back at 0 and keeps the others, the pruner of a node that
/// starts sweeps at once, and a cleared group counts from nothing again
/// when it runs. (Before, every group that ever ran kept its key.)
async fn a_group_that_runs_nothing_leaves_no_counter(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let _w = register(&node, T, b"w").await;
    add_in(&node, "a1", "ga").await;
    add_in(&node, "b1", "gb").await;
    let ha = accept_now(jobs, T, b"w").await;
    let hb = accept_now(jobs, T, b"w").await;
    assert_eq!((ha.job.id.as_slice(), hb.job.id.as_slice()), (&b"a1"[..], &b"b1"[..]));
    jobs.finish(&ha.fence(), b"{}").await.unwrap();
    assert!(idle(group_counter(&node, "ga").await));
    assert_eq!(group_counter(&node, "gb").await, Some(1));

    let swept = sweep(&node, None, 500).await;
    assert!(swept.cleared <= 1 && swept.next.is_none(), "{swept:?}");
    assert_eq!((group_counter(&node, "ga").await, group_counter(&node, "gb").await), (None, Some(1)));
    // The pruner's read before a sweep: nothing at 0 now (gb runs one).
    assert_eq!(idle_ahead(&node).await, (false, None));

    // A sweep in batches goes on after the last key it looked at.
    add_in(&node, "c1", "gc").await;
    let hc = accept_now(jobs, T, b"w").await;
    jobs.finish(&hc.fence(), b"{}").await.unwrap();
    assert!(idle_ahead(&node).await.0 || group_counter(&node, "gc").await.is_none(), "gc is at 0");
    let first = sweep(&node, None, 1).await;
    let gb_key = node.keyspace().group_running(T, b"gb");
    assert_eq!((first.cleared, first.next.as_ref()), (0, Some(&gb_key)), "gb, which runs a job, first");
    let second = sweep(&node, Some(&gb_key), 1).await;
    assert!(second.cleared <= 1, "{second:?}");
    assert_eq!(group_counter(&node, "gc").await, None, "gc, after gb");

    // The pruner of a node that starts sweeps at once.
    jobs.finish(&hb.fence(), b"{}").await.unwrap();
    assert!(idle(group_counter(&node, "gb").await));
    let other = c.node();
    let gone = eventually(Duration::from_secs(10), || async { group_counter(&other, "gb").await.is_none() }).await;
    assert!(gone, "the new node's pruner cleared the idle group's counter");

    // A cleared group runs again and counts from nothing.
    add_in(&node, "a2", "ga").await;
    let ha2 = accept_now(jobs, T, b"w").await;
    assert_eq!(group_counter(&node, "ga").await, Some(1));
    jobs.finish(&ha2.fence(), b"{}").await.unwrap();
    assert!(idle(group_counter(&node, "ga").await));
    other.stop().await;
    node.stop().await;
}

/// A sweep that read a group's counter at 0 and a run of that group
/// starting before the sweep commits: the count is not lost. On
/// FoundationDB and `sim` the sweep's read conflict on the key it clears
/// fails its commit (`Conflict`: the retry loop would read again); on the
/// embedded store the run's transaction waits for the sweep's, and adds
/// to a missing counter. Either way the counter reads 1 after both.
async fn a_sweep_loses_no_run_that_starts_meanwhile(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let _w = register(&node, T, b"w").await;
    add_in(&node, "a1", "ga").await;
    let h = accept_now(jobs, T, b"w").await;
    jobs.finish(&h.fence(), b"{}").await.unwrap();
    assert!(idle(group_counter(&node, "ga").await));

    let ks = node.keyspace().clone();
    let db = node.db();
    let sweep = db.create_transaction(&TxOptions::write()).await.expect("the sweep's transaction");
    let swept = ops::clear_idle_groups(&sweep, &ks, None, 500).await.expect("sweep");
    // 0: the node's own pruner cleared it first (at a minute's turn).
    assert!(swept.cleared <= 1);
    let key = ks.group_running(T, b"ga");
    let (db2, k2) = (db.clone(), key.clone());
    // A run of the group starting: its +1 (blind, as `place` writes it).
    let start = tokio::spawn(async move {
        run(db2.as_ref(), TxOptions::write(), |tx| {
            let k = k2.clone();
            async move {
                tx.atomic_add(&k, 1);
                Ok(())
            }
        })
        .await
    });
    if store != StoreKind::Embedded {
        // Committed before the sweep's commit.
        start.await.unwrap().expect("the run's +1");
        let committed = sweep.commit().await.map(|_| ());
        if swept.cleared == 1 {
            assert_eq!(committed, Err(StoreError::Conflict), "{store:?}");
        } else {
            assert_eq!(committed, Ok(()), "{store:?}: nothing cleared, nothing to conflict on");
        }
    } else {
        // Waits for the sweep's transaction (the store's one writer).
        assert!(sweep.commit().await.is_ok());
        start.await.unwrap().expect("the run's +1");
    }
    assert_eq!(group_counter(&node, "ga").await, Some(1), "{store:?}: the run's count is kept");
    node.stop().await;
}

couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread", worker_threads = 4),
    stores: [embedded: Embedded, sim: Sim],
    tests: [
        a_group_that_runs_nothing_leaves_no_counter,
        a_sweep_loses_no_run_that_starts_meanwhile,
    ],
);
