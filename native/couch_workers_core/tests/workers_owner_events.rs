//! A registration tells its owner what only its heartbeat
//! can find: that a reaper removed the worker while it lived (and the
//! heartbeat registered it again, under the same registration), or that
//! another registration of the same id replaced it. Through the public
//! `Node` API, as the NIF uses it.

mod jobs_common;

use std::sync::Mutex;
use std::time::Duration;

use couch_workers_core::jobs::JobState;
use couch_workers_core::roster;
use couch_workers_core::services::owner_events::{OnOwnerEvent, OwnerEvent};
use couch_workers_core::store::{run, TxOptions};
use couch_workers_core::workers::WorkerSpec;
use jobs_common::*;
use tokio::sync::mpsc;

const T: &[u8] = b"replicator";

/// Timeout 1 s: heartbeats about every 333 ms.
fn spec_1s() -> WorkerSpec {
    WorkerSpec { worker_type: T.to_vec(), id: b"w".to_vec(), options_json: b"{}".to_vec(), timeout_s: 1 }
}

fn listener() -> (OnOwnerEvent, mpsc::UnboundedReceiver<OwnerEvent>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let tx = Mutex::new(tx);
    (
        Box::new(move |e| {
            let _ = tx.lock().unwrap().send(e);
        }),
        rx,
    )
}

async fn next(rx: &mut mpsc::UnboundedReceiver<OwnerEvent>) -> OwnerEvent {
    tokio::time::timeout(Duration::from_secs(20), rx.recv()).await.expect("an owner event within 20 s").expect("open")
}

async fn a_worker_reaped_while_it_lives_tells_its_owner_and_rejoins(store: StoreKind) {
    let c = Cluster::on(store);
    let (node, reaper) = (c.node(), c.node());
    let reg = node.register_worker(spec_1s()).await.expect("register");
    let (on_event, mut rx) = listener();
    assert!(!reg.listen(on_event));
    add(node.jobs(), T, b"j", 0).await;
    let handle = accept_now(node.jobs(), T, b"w").await;

    // Another node's reaper removes the worker, as it would after judging
    // it dead (its node could not write for longer than its timeout).
    let health_key = ks(&reaper).health(T, b"w");
    let observed = raw_get(&reaper, &health_key).await.expect("a health record");
    let kss = ks(&reaper).clone();
    let reaped = run(reaper.db().as_ref(), TxOptions::write(), |tx| {
        let (kss, observed) = (kss.clone(), observed.clone());
        async move { roster::reap(&tx, &kss, T, b"w", &observed).await }
    })
    .await
    .expect("reap");
    assert!(reaped, "the record was still the observed one");
    assert_eq!(get(reaper.jobs(), T, b"j").await.state, JobState::Pending, "its job was given back");

    assert_eq!(next(&mut rx).await, OwnerEvent::Reaped);
    let member = ks(&reaper).member(T, b"w");
    assert_eq!(raw_get(&reaper, &member).await, Some(b"{}".to_vec()), "registered again");
    assert!(!reg.is_superseded());
    assert!(!reg.is_removed(), "the same registration");
    // The old handle is refused; the registration takes the job again.
    assert!(node.jobs().finish(&fence(&handle), b"{}").await.is_err(), "the old handle is refused");
    let again = accept_now(node.jobs(), T, b"w").await;
    node.jobs().finish(&fence(&again), b"{}").await.expect("a new accept finishes");
    drop(reg);
    node.stop().await;
    reaper.stop().await;
}

async fn a_registration_replaced_by_another_nodes_tells_its_owner_once(store: StoreKind) {
    let c = Cluster::on(store);
    let (a, b) = (c.node(), c.node());
    let first = a.register_worker(spec_1s()).await.expect("register on a");
    let (on_event, mut rx) = listener();
    assert!(!first.listen(on_event));
    let second = b.register_worker(spec_1s()).await.expect("register on b, replacing a's");
    // a's next heartbeat finds b's incarnation.
    assert_eq!(next(&mut rx).await, OwnerEvent::Superseded);
    assert!(first.is_superseded());
    assert!(!second.is_superseded());
    // The task tells the owner, then ends: its count drops just after.
    let told = std::time::Instant::now();
    while a.stats().heartbeats != 0 && told.elapsed() < std::time::Duration::from_secs(10) {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(a.stats().heartbeats, 0, "a's heartbeat stopped");
    // A listener set later (a restarted owner) learns it, but is not told again.
    let (late, mut late_rx) = listener();
    assert!(first.listen(late));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(late_rx.try_recv().is_err(), "no second event");
    assert!(rx.try_recv().is_err(), "no second event");
    // b's registration is untouched by a's (dropped) handle.
    drop(first);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(raw_get(&a, &ks(&a).member(T, b"w")).await, Some(b"{}".to_vec()));
    drop(second);
    a.stop().await;
    b.stop().await;
}

async fn an_event_before_the_first_listener_is_kept_for_it(store: StoreKind) {
    let c = Cluster::on(store);
    let (a, b) = (c.node(), c.node());
    let first = a.register_worker(spec_1s()).await.expect("register on a");
    let _second = b.register_worker(spec_1s()).await.expect("register on b");
    let gone = eventually(Duration::from_secs(5), || async { first.is_superseded() }).await;
    assert!(gone, "a's heartbeat found b's registration");
    let (on_event, mut rx) = listener();
    assert!(first.listen(on_event));
    assert_eq!(next(&mut rx).await, OwnerEvent::Superseded);
    drop(first);
    a.stop().await;
    b.stop().await;
}

couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread"),
    stores: [embedded: Embedded],
    tests: [
        a_worker_reaped_while_it_lives_tells_its_owner_and_rejoins,
        a_registration_replaced_by_another_nodes_tells_its_owner_once,
        an_event_before_the_first_listener_is_kept_for_it,
    ],
);
