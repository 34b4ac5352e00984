//! An idle node's background work is bounded by what the
//! liveness rule needs, not by timers. One test per binary: it counts the
//! process-wide transaction counter (`metrics::STORE`).

mod jobs_common;

use std::time::Duration;

use couch_workers_core::metrics;
use jobs_common::*;

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_node_runs_few_transactions() {
    let c = Cluster::new();
    let node = c.node();
    // One worker (timeout 15 s: a heartbeat every ~5 s, a liveness cadence
    // of 3.75 s) and one membership watcher, as in bench I1.
    let reg = register(&node, b"idle", b"w").await;
    let _watch = node.watch_membership(b"idle".to_vec(), Box::new(|_| {})).expect("watch");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = metrics::STORE.snapshot().transactions;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let ran = metrics::STORE.snapshot().transactions - before;
    eprintln!("an idle node ran {ran} transactions in 8 s");
    // Reaper passes (2 transactions each with one worker type: the
    // writable look and the scan; `tests/reaper_pass.rs`) about twice per
    // heartbeat period, heartbeats every ~5 s, the sweeper's safety pass
    // every ~10 s: about 9 in 8 s. The reaper's former half-second cadence
    // alone was ~50, the pruner's second 8.
    assert!(ran <= 30, "an idle node ran {ran} transactions in 8 s");
    drop(reg);
    node.stop().await;
}
