//! A dead worker is reaped on an otherwise idle FoundationDB-like cluster
//! (the sim store's versions: read versions stand still between commits,
//! an empty batch every 2 s).
//!
//! Found by bench/run's M3 on a real FoundationDB (7.1, 1 process, memory
//! engine): a worker with timeout 3 s whose node was killed stayed in the
//! membership for good, while the surviving node's reaper logged
//! `reaper_observation_restarted` (reason `version_jump`) at every pass.
//! The pass's first look, the pulse transaction, had a read version as old
//! as the previous commit (the previous pass's pulse, ~one stall bound of
//! 750 ms earlier), and the scan right after it read at the pulse's fresh
//! commit version: ~750 ms of versions within a few milliseconds of local
//! time, more than the observer's jump slack (500 ms) allows.

mod faults_common;

use std::time::{Duration, Instant};

use couch_workers_core::store::sim::{SimOptions, SimStore};
use couch_workers_core::store::Db;
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Node, Settings};
use faults_common::*;

const T: &[u8] = b"m3";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_worker_is_reaped_on_an_idle_cluster() {
    let cluster = SimStore::new(SimOptions::new(7));
    let settings = Settings::default();
    let log_a = CaptureLog::new();
    let a = Node::with_db(cluster.connect() as Db, settings, log_a.clone());
    let b = Node::with_db(cluster.connect() as Db, settings, CaptureLog::new());
    let spec = WorkerSpec { worker_type: T.to_vec(), id: b"w-1".to_vec(), options_json: b"{}".to_vec(), timeout_s: 3 };
    let reg = b.register_worker(spec).await.expect("register");
    // Node A observes the worker for a few heartbeats; then B dies
    // without a goodbye (its heartbeats stop, nobody unregisters).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    b.stop().await;
    let died = Instant::now();
    std::mem::forget(reg);
    // Gone within its timeout and a few reaper passes (M3 on the embedded
    // store: ~3.3 s); the membership as one snapshot of the store sees it.
    let gone = loop {
        let snap = snapshot(a.db().as_ref(), a.keyspace()).await;
        if snap.members_of(T).is_empty() {
            break true;
        }
        if died.elapsed() > Duration::from_secs(8) {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let jumps = log_a
        .named("reaper_observation_restarted")
        .iter()
        .filter(|e| field(e, "reason").as_deref() == Some("version_jump"))
        .count();
    assert!(
        gone,
        "the dead worker is still a member {:?} after its node died (timeout 3 s); \
         node A's reaper restarted its observation {jumps} times for a version jump",
        died.elapsed()
    );
    assert_eq!(jumps, 0, "no recovery happened, yet node A's reaper saw {jumps} version jumps");
    a.stop().await;
}
