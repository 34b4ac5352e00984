//! Nodes on one embedded store handle (`Node::with_db` with the same
//! handle; the NIF opens one per node, tests and benchmarks may share):
//! each node's renewals spare the handle's watches of `health_vs`, the
//! other nodes' reapers' included, and tell only its own reaper
//! (`Heartbeats::renewed` is per node). That holds back no reaper: once
//! one node stops renewing, its worker is reaped within its timeout plus
//! 1 s (the bound of `faults_liveness.rs`) while the other nodes renew
//! theirs all along, and none of theirs is ever reaped.
//!
//! "Stops" without closing the handle the others share (`Node::stop`
//! closes its store): every transaction of the stopping node fails from
//! then on (its view of the handle is the fault wrapper, switched on), as
//! a node whose process hangs; its reaper cannot reap either, so the live
//! nodes' must.

mod faults_common;

use std::time::{Duration, Instant};

use couch_workers_core::keyspace::Keyspace;
use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::faulty::{FaultPlan, FaultyStore};
use couch_workers_core::store::Db;
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Node, Settings};
use faults_common::*;

const T: &[u8] = b"replicator";

/// The smallest health timeout: the test is short.
const TIMEOUT_S: u64 = 1;

fn settings() -> Settings {
    Settings { reaper_max_interval: Duration::from_millis(200), ..Settings::default() }
}

fn spec(id: &[u8]) -> WorkerSpec {
    WorkerSpec { worker_type: T.to_vec(), id: id.to_vec(), options_json: b"{}".to_vec(), timeout_s: TIMEOUT_S }
}

/// Every call of B's fails (non-retryable) once switched on.
fn cut_off() -> FaultPlan {
    FaultPlan { enabled: false, ..FaultPlan::retryable(1, 1.0).with_io(1.0) }
}

/// Nodes on one handle: `live` renew their workers all along; `stopping`
/// (its view of the handle is the fault wrapper) renews its worker until
/// it stops. Its worker must be reaped, by the live nodes' reapers,
/// within the timeout plus 1 s, and no live node's worker ever.
async fn stopped_nodes_worker_reaped(live: usize) {
    count_panics();
    let tmp = tempfile::tempdir().expect("temp dir");
    let store = EmbeddedStore::open(EmbeddedOptions::new(tmp.path())).expect("open the store");
    let shared: Db = store.clone();
    let stopping_view = FaultyStore::wrap(shared.clone(), cut_off());
    let mut nodes = Vec::new();
    let mut regs = Vec::new();
    for i in 0..live {
        let log = CaptureLog::new();
        let node = Node::with_db(shared.clone(), settings(), log.clone());
        let id = format!("live-{i}").into_bytes();
        regs.push(node.register_worker(spec(&id)).await.expect("register a live node's worker"));
        nodes.push((node, log));
    }
    let stopping_log = CaptureLog::new();
    let stopping = Node::with_db(stopping_view.clone(), settings(), stopping_log.clone());
    let reg_stopping = stopping.register_worker(spec(b"stopping")).await.expect("register the stopping node's worker");
    let ks = Keyspace::new(&shared.prefix());
    let members = || async { snapshot(shared.as_ref(), &ks).await.members_of(T) };
    let reaped = || nodes.iter().map(|(_, log)| log.count("worker_reaped")).sum::<usize>();
    let live_ids: Vec<Vec<u8>> = (0..live).map(|i| format!("live-{i}").into_bytes()).collect();

    // Every node renews for a while: nobody is reaped.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(members().await.len(), live + 1, "every worker lives while every node renews");

    stopping_view.set_enabled(true);
    let stopped = Instant::now();
    let left = loop {
        let now = members().await;
        for id in &live_ids {
            assert!(now.contains(id), "a live node's worker, renewed all along, was reaped");
        }
        if !now.contains(b"stopping".as_slice()) {
            break stopped.elapsed();
        }
        let waited = stopped.elapsed();
        assert!(waited < Duration::from_secs(TIMEOUT_S + 3), "the stopped node's worker not reaped within {waited:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let beats: u64 = nodes.iter().map(|(n, _)| n.heartbeat_transactions()).sum();
    eprintln!("{live} live node(s): the stopped node's worker left after {left:?} (timeout {TIMEOUT_S} s); live heartbeat transactions {beats}");
    assert!(left <= Duration::from_secs(TIMEOUT_S + 1), "the stopped node's worker reaped only after {left:?}");
    // Its last renewal was at most about a third of the timeout before
    // the stop: not reaped before the rest of the timeout passed.
    assert!(left >= Duration::from_secs(TIMEOUT_S) / 2, "reaped after only {left:?}");
    assert_eq!(reaped(), 1, "a live node's reaper reaped it, once");
    // The live nodes renew for two timeouts more: none of theirs is reaped.
    tokio::time::sleep(Duration::from_secs(2 * TIMEOUT_S)).await;
    let now = members().await;
    for id in &live_ids {
        assert!(now.contains(id), "a live node's worker, renewed all along, was reaped");
    }
    assert_eq!(reaped() + stopping_log.count("worker_reaped"), 1, "only the stopped node's worker was reaped");
    drop(reg_stopping);
    for ((node, _), reg) in nodes.iter().zip(&regs) {
        node.unregister_worker(reg).await.expect("unregister a live node's worker");
    }
    stopping.stop().await;
    for (node, _) in &nodes {
        node.stop().await;
    }
    assert_eq!(panics(), 0, "no panic in any background task");
}

/// Node A renews; node B, on A's handle, stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_nodes_worker_is_reaped_while_a_node_on_the_same_handle_renews() {
    stopped_nodes_worker_reaped(1).await;
}

/// Nodes A and B renew on one handle (each one's renewals spare the
/// other's reaper's watch and tell only its own reaper); node C stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_nodes_worker_is_reaped_while_two_nodes_on_the_same_handle_renew() {
    stopped_nodes_worker_reaped(2).await;
}
