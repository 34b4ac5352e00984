//! Leadership of a worker type: the oldest current registration leads,
//! `leader` reads it at one version, each leadership has its own epoch (a
//! later one compares greater), owners are told `Leader` and
//! `LeaderLost`, and `if_leader` writes only while its epoch leads,
//! checked in the writing transaction.

mod jobs_common;

use std::sync::Mutex;
use std::time::Duration;

use couch_workers_core::jobs::{JobOpts, JobState};
use couch_workers_core::leaders::Leadership;
use couch_workers_core::leadership::leads;
use couch_workers_core::leadership::LeaderFence;
use couch_workers_core::services::leadership::{LeaderEvent, OnLeaderEvent};
use couch_workers_core::store::{StoreError, TxOptions};
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Error, Jobs, Node, Settings};
use jobs_common::*;
use tokio::sync::mpsc;

const T: &[u8] = b"replicator";
const JOBS: &[u8] = b"cleanup";

fn listener() -> (OnLeaderEvent, mpsc::UnboundedReceiver<LeaderEvent>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let tx = Mutex::new(tx);
    (
        Box::new(move |e| {
            let _ = tx.lock().unwrap().send(e);
        }),
        rx,
    )
}

async fn next(rx: &mut mpsc::UnboundedReceiver<LeaderEvent>) -> LeaderEvent {
    tokio::time::timeout(Duration::from_secs(20), rx.recv()).await.expect("a leader event within 20 s").expect("open")
}

/// Nothing more arrives within `for_ms`.
async fn quiet(rx: &mut mpsc::UnboundedReceiver<LeaderEvent>, for_ms: u64) {
    if let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(for_ms), rx.recv()).await {
        panic!("unexpected leader event {e:?}");
    }
}

fn leadership(node: &Node) -> Leadership {
    Leadership::new(node.context().clone())
}

fn fence(epoch: &[u8]) -> LeaderFence {
    LeaderFence { worker_type: T.to_vec(), epoch: epoch.to_vec() }
}

async fn leader(node: &Node) -> Option<(Vec<u8>, Vec<u8>)> {
    leadership(node).leader(T).await.expect("leader")
}

async fn the_oldest_registration_leads_and_the_next_epoch_is_greater(store: StoreKind) {
    let c = Cluster::on(store);
    let (a, b) = (c.node(), c.node());
    assert_eq!(leader(&a).await, None, "no worker, no leader");
    let w1 = register(&a, T, b"w1").await;
    let (on1, mut rx1) = listener();
    w1.listen_leadership(on1);
    let w2 = register(&b, T, b"w2").await;
    let (on2, mut rx2) = listener();
    w2.listen_leadership(on2);

    let (id, e1) = leader(&b).await.expect("a leader");
    assert_eq!(id, b"w1", "the oldest registration leads");
    assert_eq!(next(&mut rx1).await, LeaderEvent::Leader(e1.clone()));
    quiet(&mut rx2, 300).await;
    // A listener set again is not told twice.
    let (again, mut rx1b) = listener();
    w1.listen_leadership(again);
    quiet(&mut rx1b, 100).await;

    w1.unregister().await.expect("unregister");
    assert_eq!(next(&mut rx1b).await, LeaderEvent::LeaderLost(e1.clone()), "told at its unregister");
    let LeaderEvent::Leader(e2) = next(&mut rx2).await else { panic!("w2 leads") };
    assert!(e2 > e1, "a later leader's epoch is greater");
    assert_eq!(leader(&a).await, Some((b"w2".to_vec(), e2.clone())));

    w2.unregister().await.expect("unregister");
    assert_eq!(next(&mut rx2).await, LeaderEvent::LeaderLost(e2));
    assert_eq!(leader(&a).await, None);
    a.stop().await;
    b.stop().await;
}

async fn a_registration_of_the_same_id_again_is_a_new_leadership(store: StoreKind) {
    let c = Cluster::on(store);
    let (a, b) = (c.node(), c.node());
    let first = register(&a, T, b"w").await;
    let (on1, mut rx1) = listener();
    first.listen_leadership(on1);
    let LeaderEvent::Leader(e1) = next(&mut rx1).await else { panic!("leads") };
    // Another node registers the same id: it replaces the first.
    let second = register(&b, T, b"w").await;
    let (on2, mut rx2) = listener();
    second.listen_leadership(on2);
    assert_eq!(next(&mut rx1).await, LeaderEvent::LeaderLost(e1.clone()));
    let LeaderEvent::Leader(e2) = next(&mut rx2).await else { panic!("the new registration leads") };
    assert!(e2 > e1);
    drop(first);
    drop(second);
    a.stop().await;
    b.stop().await;
}

async fn if_leader_writes_only_while_its_epoch_leads(store: StoreKind) {
    let c = Cluster::on(store);
    let (a, b) = (c.node(), c.node());
    let jobs = Jobs::new(a.context().clone());
    let l = leadership(&a);
    let w1 = register(&a, T, b"w1").await;
    let w2 = register(&b, T, b"w2").await;
    let (_, e1) = leader(&a).await.expect("w1 leads");
    // An epoch that is not the leader's (w2's will be another).
    let not_yet = [e1.clone(), b"x".to_vec()].concat();

    l.add(JOBS, b"j1", b"{}", &JobOpts::default(), &fence(&e1)).await.expect("the leader's epoch writes");
    assert_eq!(jobs.get(JOBS, b"j1").await.expect("added").state, JobState::Pending);
    for wrong in [fence(&not_yet), LeaderFence { worker_type: b"other".to_vec(), epoch: e1.clone() }] {
        assert_eq!(l.add(JOBS, b"j2", b"{}", &JobOpts::default(), &wrong).await, Err(Error::NotLeader));
        assert_eq!(jobs.get(JOBS, b"j2").await, Err(Error::NotFound), "nothing written");
    }
    // While its epoch leads, the job's own answers stand.
    assert_eq!(l.add(JOBS, b"j1", b"{}", &JobOpts::default(), &fence(&e1)).await, Err(Error::AlreadyExists));

    w1.unregister().await.expect("unregister");
    let (_, e2) = leader(&a).await.expect("w2 leads");
    assert_eq!(l.add(JOBS, b"j3", b"{}", &JobOpts::default(), &fence(&e1)).await, Err(Error::NotLeader));
    assert_eq!(jobs.get(JOBS, b"j3").await, Err(Error::NotFound), "a stale epoch writes nothing");
    assert_eq!(
        l.resubmit(JOBS, b"j1", b"{\"n\":1}", &JobOpts::default(), None, &fence(&e1)).await,
        Err(Error::NotLeader)
    );
    assert_eq!(jobs.get(JOBS, b"j1").await.expect("j1").info, b"{}".to_vec(), "a stale resubmit writes nothing");
    l.resubmit(JOBS, b"j1", b"{\"n\":1}", &JobOpts::default(), None, &fence(&e2)).await.expect("the new leader's");
    assert_eq!(jobs.get(JOBS, b"j1").await.expect("j1").info, b"{\"n\":1}".to_vec());
    drop(w2);
    a.stop().await;
    b.stop().await;
}

/// The fence is read in the writing transaction: a change of leader that
/// commits between its check and its commit makes the write conflict
/// (FoundationDB's and the sim store's optimistic conflicts).
async fn a_change_of_leader_before_the_commit_makes_the_fenced_write_conflict(store: StoreKind) {
    let c = Cluster::on(store);
    let (a, b) = (c.node(), c.node());
    let w1 = register(&a, T, b"w1").await;
    let _w2 = register(&b, T, b"w2").await;
    let (_, e1) = leader(&a).await.expect("w1 leads");
    let tx = a.db().create_transaction(&TxOptions::write()).await.expect("tx");
    assert!(leads(&tx, a.keyspace(), &fence(&e1)).await.expect("read"), "w1 leads at the check");
    w1.unregister().await.expect("the leader goes meanwhile");
    tx.set(&a.keyspace().job(JOBS, b"fenced"), b"x");
    assert_eq!(tx.commit().await.err(), Some(StoreError::Conflict), "the fenced write does not commit");
    b.stop().await;
    a.stop().await;
}

fn spec_1s(id: &[u8]) -> WorkerSpec {
    WorkerSpec { worker_type: T.to_vec(), id: id.to_vec(), options_json: b"{}".to_vec(), timeout_s: 1 }
}

/// A leader whose node stops heartbeating is replaced only once a reaper
/// removed its registration by the liveness rule; until then it still
/// leads and fenced writes of its epoch still land.
async fn a_dead_leader_is_replaced_only_after_its_reap(store: StoreKind) {
    let c = Cluster::on(store);
    let fast = Settings { reaper_max_interval: Duration::from_millis(200), ..Settings::default() };
    let (a, b) = (c.node_with(fast), c.node_with(fast));
    let w1 = a.register_worker(spec_1s(b"w1")).await.expect("register");
    let w2 = b.register_worker(spec_1s(b"w2")).await.expect("register");
    let (on2, mut rx2) = listener();
    w2.listen_leadership(on2);
    let (_, e1) = leader(&b).await.expect("w1 leads");
    // Node a dies: its registration stays until a reaper removes it.
    a.stop().await;
    drop(w1);
    let member = ks(&b).member(T, b"w1");
    let LeaderEvent::Leader(e2) = next(&mut rx2).await else { panic!("w2 leads") };
    assert_eq!(raw_get(&b, &member).await, None, "the old leader's registration is gone when w2 is told");
    assert!(e2 > e1);
    let l = leadership(&b);
    assert_eq!(l.add(JOBS, b"late", b"{}", &JobOpts::default(), &fence(&e1)).await, Err(Error::NotLeader));
    drop(w2);
    b.stop().await;
}

couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread"),
    stores: [embedded: Embedded, sim: Sim],
    tests: [
        the_oldest_registration_leads_and_the_next_epoch_is_greater,
        a_registration_of_the_same_id_again_is_a_new_leadership,
        if_leader_writes_only_while_its_epoch_leads,
        a_dead_leader_is_replaced_only_after_its_reap,
    ],
);

mod optimistic {
    use super::*;
    couch_workers_core::store_tests!(
        runtime: (flavor = "multi_thread"),
        stores: [sim: Sim],
        tests: [a_change_of_leader_before_the_commit_makes_the_fenced_write_conflict],
    );
}
