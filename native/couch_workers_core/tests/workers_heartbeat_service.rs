//! One heartbeat service per node renews all of its
//! workers in few transactions, while each worker keeps its own period
//! (the liveness rule stays exact per worker).

mod jobs_common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Node, Registration};
use jobs_common::*;

const T: &[u8] = b"hb";

fn spec_with(id: &str, timeout_s: u64) -> WorkerSpec {
    WorkerSpec { worker_type: T.to_vec(), id: id.as_bytes().to_vec(), options_json: b"{}".to_vec(), timeout_s }
}

async fn register_many(node: &Arc<Node>, prefix: &str, n: usize, timeout_s: u64) -> Vec<Registration> {
    let mut regs = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(250) {
        let futs = chunk.iter().map(|i| node.register_worker(spec_with(&format!("{prefix}-{i}"), timeout_s)));
        for r in futures::future::join_all(futs).await {
            regs.push(r.expect("register"));
        }
    }
    regs
}

/// Every health record of the type, by key.
async fn health_records(node: &Node) -> HashMap<Vec<u8>, Vec<u8>> {
    range(node, ks(node).health_range(T)).await.into_iter().collect()
}

async fn many_workers_on_one_node_are_renewed_by_few_transactions(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    // Timeout 3 s: each worker is renewed about every second.
    let regs = register_many(&node, "w", 2500, 3).await;
    let before = health_records(&node).await;
    assert_eq!(before.len(), 2500);
    let tx0 = node.heartbeat_transactions();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let tx1 = node.heartbeat_transactions();
    let after = health_records(&node).await;
    let renewed = before.iter().filter(|(k, v)| after.get(*k).is_some_and(|a| a != *v)).count();
    assert_eq!(renewed, 2500, "every worker was renewed within 2.5 periods");
    // One heartbeat transaction per worker would be 2,500 a period; three
    // chunks of at most 1,000, at most twice a period, are what batching
    // allows (generous for retries on a loaded machine).
    assert!(tx1 - tx0 <= 60, "{} heartbeat transactions renewed 2,500 workers over 2.5 periods", tx1 - tx0);
    eprintln!("heartbeat transactions over 2.5 s for 2,500 workers: {}", tx1 - tx0);
    drop(regs);
    node.stop().await;
}

async fn a_short_timeout_among_long_ones_keeps_its_own_period(store: StoreKind) {
    let c = Cluster::on(store);
    let (node, other) = (c.node(), c.node());
    let long = register_many(&node, "long", 300, 60).await;
    // Timeout 2 s, renewed about every 667 ms: a busy machine's stall of
    // a second cannot reap it, while the bug (renewed with the long ones,
    // every 20 s) makes no renewal at all in the 4 s watched.
    let short = node.register_worker(spec_with("short", 2)).await.expect("register");
    let long_before = health_records(&node).await;
    let key = ks(&node).health(T, b"short");
    // Two reapers (this node's and another's) run all along.
    let mut last = raw_get(&node, &key).await.expect("a health record");
    let (mut changed_at, mut changes, mut longest) = (Instant::now(), 0, Duration::ZERO);
    let end = Instant::now() + Duration::from_secs(4);
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = raw_get(&node, &key).await.expect("the short worker is never reaped while its node lives");
        if now != last {
            longest = longest.max(changed_at.elapsed());
            (last, changed_at, changes) = (now, Instant::now(), changes + 1);
        }
    }
    longest = longest.max(changed_at.elapsed());
    eprintln!("short worker (timeout 2 s): {changes} renewals in 4 s, longest gap {longest:?}");
    // Renewed about every 667 ms: 6 in 4 s on a quiet machine.
    assert!(changes >= 3, "{changes} renewals of a 2 s worker in 4 s");
    assert!(longest < Duration::from_secs(2), "a gap of {longest:?} would let a reaper reap it");
    assert!(!short.is_removed() && !short.is_superseded());
    // The long workers (period 20 s) were not renewed along with it.
    let long_after = health_records(&node).await;
    let renewed_long = long_before
        .iter()
        .filter(|(k, v)| k.as_slice() != key.as_slice() && long_after.get(*k).is_some_and(|a| a != *v))
        .count();
    assert_eq!(renewed_long, 0, "workers with a 60 s timeout renewed within 4 s");
    drop((long, short));
    node.stop().await;
    other.stop().await;
}

async fn workers_unregistered_while_renewals_run_are_not_reinstated(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    // Timeout 1 s: renewals run every ~333 ms while the unregisters do.
    let regs = register_many(&node, "w", 1000, 1).await;
    let start = Instant::now();
    // Spread over about three periods, so that removals meet renewals.
    for (i, reg) in regs.iter().enumerate() {
        reg.unregister().await.expect("unregister");
        if i % 50 == 49 {
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    }
    eprintln!("1,000 unregisters took {:?}", start.elapsed());
    // Two more periods: a renewal that raced a removal would have
    // registered its worker again by now.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let members = range(&node, ks(&node).members_range(T)).await;
    assert!(members.is_empty(), "{} unregistered workers were reinstated", members.len());
    assert_eq!(node.stats().heartbeats, 0);
    drop(regs);
    node.stop().await;
}

couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread"),
    stores: [embedded: Embedded],
    tests: [
        many_workers_on_one_node_are_renewed_by_few_transactions,
        a_short_timeout_among_long_ones_keeps_its_own_period,
        workers_unregistered_while_renewals_run_are_not_reinstated,
    ],
);
