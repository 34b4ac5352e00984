//! An idle node with 100 schedules sleeps until the earliest slot: it
//! runs no transaction on a timer. A count, which the machine's load does
//! not change; the node's CPU over such a window is a benchmark figure
//! (bench/run's I2), not an assertion here. One test per binary: it reads
//! the process-wide transaction counter.

mod jobs_common;

use std::time::Duration;

use couch_workers_core::jobs::JobOpts;
use couch_workers_core::metrics;
use couch_workers_core::recurring::Schedules;
use jobs_common::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_node_with_100_schedules_runs_no_transaction_until_the_earliest_slot() {
    let c = Cluster::new();
    let node = c.node();
    let s = Schedules::new(node.context().clone());
    for i in 0..100 {
        let id = format!("s{i}");
        // Hourly and daily slots: none falls in the window but by chance
        // at an hour's turn (then a few transactions, still few).
        let spec = if i % 2 == 0 { r#"{"every": 3600000}"# } else { r#"{"cron": "17 3 * * *"}"# };
        s.set(b"idle", id.as_bytes(), spec.as_bytes(), b"{}", &JobOpts::default(), None).await.expect("set");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = metrics::STORE.snapshot().transactions;
    // 3 s: a runner that polled twice a second instead of sleeping until
    // the earliest slot would run about 6 here.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ran = metrics::STORE.snapshot().transactions - before;
    eprintln!("an idle node with 100 schedules: {ran} transactions in 3 s");
    assert!(ran <= 3, "an idle node with 100 schedules ran {ran} transactions in 3 s");
    node.stop().await;
}
