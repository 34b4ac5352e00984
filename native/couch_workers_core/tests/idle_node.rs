//! I1, an idle node: a node with nothing to do runs no transactions on a
//! timer: its promoter and pruner sleep until a change of `scheduled_vs`
//! or `expiry_vs` (or their 30 s safety cap), its reaper while it observes
//! no worker until a change of `health_vs`. One test per binary: it counts
//! the process-wide transaction counter (`metrics::STORE`).

mod jobs_common;

use std::time::Duration;

use couch_workers_core::metrics;
use jobs_common::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_node_with_nothing_to_do_runs_no_transactions_on_a_timer() {
    let c = Cluster::new();
    let node = c.node();
    // A type with a job that waits an hour and one that keeps a day: the
    // promoter and the pruner each know of work, far off.
    let jobs = node.jobs();
    let later = couch_workers_core::jobs::JobOpts {
        schedule: Some(couch_workers_core::jobs::Schedule::Delay(3_600_000)),
        ..Default::default()
    };
    jobs.add_with(b"t", b"later", b"{}", &later).await.expect("add");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = metrics::STORE.snapshot().transactions;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let ran = metrics::STORE.snapshot().transactions - before;
    eprintln!("a node with nothing to do ran {ran} transactions in 8 s");
    // The sweeper's 10 s safety pass may fall in the window (one read);
    // the promoter's former 1 s cadence alone was 8, the pruner's 3 s 2-3.
    assert!(ran <= 2, "a node with nothing to do ran {ran} transactions in 8 s");
    node.stop().await;
}
