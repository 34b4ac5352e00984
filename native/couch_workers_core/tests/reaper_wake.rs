//! The reaper looks when a health record changes (it
//! watches `health_vs`), not on a short timer; a worker whose node died
//! right after a heartbeat is still reaped within its timeout + 1 s, with
//! the default settings and a timeout whose liveness cadence (a quarter
//! of it, 2 s) alone would see that last heartbeat too late.

mod jobs_common;

use std::time::{Duration, Instant};

use couch_workers_core::workers::WorkerSpec;
use jobs_common::*;

const T: &[u8] = b"rw";

async fn a_node_killed_right_after_a_heartbeat_is_reaped_within_timeout_plus_1_s(store: StoreKind) {
    let c = Cluster::on(store);
    let (a, b) = (c.node(), c.node());
    let timeout = Duration::from_secs(8);
    let spec = WorkerSpec { worker_type: T.to_vec(), id: b"w".to_vec(), options_json: b"{}".to_vec(), timeout_s: 8 };
    let reg = b.register_worker(spec).await.expect("register on b");
    let health = ks(&a).health(T, b"w");
    let member = ks(&a).member(T, b"w");
    // Wait for b's first heartbeat (about 2.7 s), then kill b at once: its
    // last record is as fresh as it gets, and a reaper that saw it only
    // at its next cadence tick (up to 2 s later) would reap too late.
    let first = raw_get(&a, &health).await.expect("a health record");
    let renewed = eventually(Duration::from_secs(6), || {
        let (a, health, first) = (&a, &health, &first);
        async move { raw_get(a, health).await.is_some_and(|now| &now != first) }
    })
    .await;
    assert!(renewed, "b renewed its worker");
    b.stop().await;
    let killed = Instant::now();
    drop(reg);
    let reaped = eventually(timeout + Duration::from_secs(3), || {
        let (a, member) = (&a, &member);
        async move { raw_get(a, member).await.is_none() }
    })
    .await;
    let took = killed.elapsed();
    eprintln!("reaped {took:?} after the kill (timeout {timeout:?})");
    assert!(reaped, "the dead node's worker was not reaped within {:?}", timeout + Duration::from_secs(3));
    assert!(took <= timeout + Duration::from_secs(1), "reaped {took:?} after the kill: more than timeout + 1 s");
    // Never before the timeout: the record was seen fresh.
    assert!(took >= timeout - Duration::from_millis(100), "reaped after only {took:?}");
    a.stop().await;
}

// On FoundationDB and `sim` too: with the dead node gone only the
// surviving reaper commits, and an idle cluster's versions move in lumps
// (each of its commits takes the whole time since the last one), which the
// reaper once read as recovery jumps and never reaped (liveness.rs).
couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread"),
    stores: [embedded: Embedded, sim: Sim],
    tests: [
        a_node_killed_right_after_a_heartbeat_is_reaped_within_timeout_plus_1_s,
    ],
);
