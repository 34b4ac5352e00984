//! Every long-lived task of a node is supervised: after a panic (injected
//! with the `testkit` hook `Node::inject_panic`) it is restarted, logged
//! (`service_restarted`) and counted (`metrics::SERVICES`), and it serves
//! again: heartbeats renew, the reaper reaps, a dispatcher serves its
//! waiting acceptor, watchers deliver the next change, the promoter,
//! pruner and sweeper do their work. A task that keeps failing is
//! reported (`service_failing`; the heartbeat's to the registrations'
//! owners).

mod jobs_common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use couch_workers_core::jobs::{JobEvent, JobOpts, JobState, Keep, NewJob, Schedule};
use couch_workers_core::log::{Event, Sink, Value};
use couch_workers_core::metrics::SERVICES;
use couch_workers_core::services::owner_events::OwnerEvent;
use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::sim::{SimOptions, SimStore};
use couch_workers_core::store::Db;
use couch_workers_core::tasks::supervise::ServiceKind;
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Node, Settings};
use jobs_common::*;
use tokio::sync::mpsc;

#[derive(Default)]
struct Collect(Mutex<Vec<Event>>);

impl Sink for Collect {
    fn log(&self, event: Event) {
        self.0.lock().unwrap().push(event);
    }
}

impl Collect {
    /// Events `what` of the service `kind`.
    fn count(&self, what: &str, kind: ServiceKind) -> usize {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter(|e| e.what == what)
            .filter(|e| e.fields.iter().any(|(k, v)| *k == "service" && *v == Value::Str(kind.name().into())))
            .count()
    }

    /// Waits (up to 10 s) until `what` of `kind` was logged `n` times.
    async fn wait(&self, what: &str, kind: ServiceKind, n: usize) {
        let ok = eventually(Duration::from_secs(10), || async { self.count(what, kind) >= n }).await;
        assert!(ok, "{what} of {} logged {} times, not {n}", kind.name(), self.count(what, kind));
    }
}

fn embedded_node(dir: &std::path::Path) -> (Arc<Node>, Arc<Collect>) {
    let store = EmbeddedStore::open(EmbeddedOptions::new(dir)).expect("open store");
    let log = Arc::new(Collect::default());
    (Node::with_db(store, Settings::default(), log.clone()), log)
}

fn worker(t: &[u8], id: &[u8], timeout_s: u64) -> WorkerSpec {
    WorkerSpec { worker_type: t.to_vec(), id: id.to_vec(), options_json: b"{}".to_vec(), timeout_s }
}

/// A worker with a 2 s timeout is renewed across a panic of its node's
/// heartbeat service: another node, looking all along, sees its record
/// change and never sees it reaped.
async fn heartbeats_renew_after_a_panic(node: Arc<Node>, log: Arc<Collect>, other: Arc<Node>) {
    const T: &[u8] = b"sup_hb";
    let restarted = SERVICES.snapshot().restarted;
    let reg = node.register_worker(worker(T, b"w", 2)).await.expect("register");
    let key = ks(&other).health(T, b"w");
    tokio::time::sleep(Duration::from_millis(300)).await;
    node.inject_panic(ServiceKind::Heartbeat, 1);
    log.wait("service_restarted", ServiceKind::Heartbeat, 1).await;
    assert!(SERVICES.snapshot().restarted > restarted, "the restart is counted");
    let mut last = raw_get(&other, &key).await.expect("registered");
    let mut changes = 0;
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = raw_get(&other, &key).await.expect("never reaped: the restarted service renews it");
        if now != last {
            changes += 1;
            last = now;
        }
    }
    assert!(changes >= 3, "renewed {changes} times in 5 s after the restart (period 667 ms)");
    assert!(!reg.is_removed());
    drop(reg);
    node.stop().await;
    other.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn heartbeats_renew_after_a_panic_embedded() {
    let dir = tempfile::tempdir().unwrap();
    let (node, log) = embedded_node(dir.path());
    let (other, _) = embedded_node(dir.path());
    heartbeats_renew_after_a_panic(node, log, other).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn heartbeats_renew_after_a_panic_sim() {
    let sim = SimStore::new(SimOptions::new(4242));
    let db: Db = sim.clone();
    let log = Arc::new(Collect::default());
    let node = Node::with_db(db.clone(), Settings::default(), log.clone());
    let other = Node::with_db(db, Settings::default(), Arc::new(Collect::default()));
    heartbeats_renew_after_a_panic(node, log, other).await;
}

/// A worker whose node stopped is still reaped by a reaper that panicked.
#[tokio::test(flavor = "multi_thread")]
async fn a_dead_worker_is_reaped_after_a_reaper_panic() {
    const T: &[u8] = b"sup_reap";
    let dir = tempfile::tempdir().unwrap();
    let (dying, _) = embedded_node(dir.path());
    let (node, log) = embedded_node(dir.path());
    let reg = dying.register_worker(worker(T, b"w", 2)).await.expect("register");
    let key = ks(&node).health(T, b"w");
    node.inject_panic(ServiceKind::Reaper, 1);
    log.wait("service_restarted", ServiceKind::Reaper, 1).await;
    // Its node stops without removing it: dead.
    dying.stop().await;
    drop(reg);
    let reaped = eventually(Duration::from_secs(10), || async { raw_get(&node, &key).await.is_none() }).await;
    assert!(reaped, "the restarted reaper reaps the dead worker");
    node.stop().await;
}

/// A waiting acceptor keeps its place across a panic of its dispatcher
/// and takes a job added after it.
#[tokio::test(flavor = "multi_thread")]
async fn a_waiting_acceptor_is_served_after_a_dispatcher_panic() {
    const T: &[u8] = b"sup_acc";
    let dir = tempfile::tempdir().unwrap();
    let (node, log) = embedded_node(dir.path());
    let _reg = register(&node, T, b"w").await;
    let jobs = node.jobs().clone();
    let j = jobs.clone();
    let accept = tokio::spawn(async move { j.accept(T, b"w", Duration::from_secs(20)).await });
    assert!(eventually(Duration::from_secs(5), || async { jobs.stats().waiters == 1 }).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    node.inject_panic(ServiceKind::Dispatcher, 1);
    log.wait("service_restarted", ServiceKind::Dispatcher, 1).await;
    add(&jobs, T, b"j1", 0).await;
    let taken = tokio::time::timeout(Duration::from_secs(10), accept).await.expect("served in time").unwrap();
    assert_eq!(taken.expect("a job").fence().job_id, b"j1".to_vec());
    node.stop().await;
}

/// A membership watcher delivers the next change after a panic.
#[tokio::test(flavor = "multi_thread")]
async fn a_membership_subscriber_gets_the_next_change_after_a_panic() {
    const T: &[u8] = b"sup_mem";
    let dir = tempfile::tempdir().unwrap();
    let (node, log) = embedded_node(dir.path());
    let _a = register(&node, T, b"a").await;
    let (sender, mut deliveries) = mpsc::unbounded_channel();
    let _watch = node
        .watch_membership(
            T.to_vec(),
            Box::new(move |m| {
                let _ = sender.send(m);
            }),
        )
        .expect("watch");
    let first = tokio::time::timeout(Duration::from_secs(5), deliveries.recv()).await.unwrap().unwrap();
    assert_eq!(first.workers.len(), 1);
    node.inject_panic(ServiceKind::Membership, 1);
    log.wait("service_restarted", ServiceKind::Membership, 1).await;
    let _b = register(&node, T, b"b").await;
    loop {
        let next = tokio::time::timeout(Duration::from_secs(5), deliveries.recv())
            .await
            .expect("a delivery after the restart")
            .unwrap();
        assert!(next.vs > first.vs, "no delivery repeats one before it");
        if next.workers.len() == 2 {
            break;
        }
    }
    node.stop().await;
}

/// A job subscriber gets the next change after its watcher panicked.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_subscriber_gets_the_next_change_after_a_panic() {
    const T: &[u8] = b"sup_sub";
    let dir = tempfile::tempdir().unwrap();
    let (node, log) = embedded_node(dir.path());
    let _reg = register(&node, T, b"w").await;
    let jobs = node.jobs().clone();
    add(&jobs, T, b"j", 0).await;
    let (on, mut rx) = events();
    let (_, _sub) = jobs.subscribe(T, b"j", on).await.expect("subscribe");
    tokio::time::sleep(Duration::from_millis(200)).await;
    node.inject_panic(ServiceKind::JobWatcher, 1);
    log.wait("service_restarted", ServiceKind::JobWatcher, 1).await;
    let _handle = accept_now(&jobs, T, b"w").await;
    match next_event(&mut rx).await {
        JobEvent::Changed(job) => assert_eq!(job.state, JobState::Running),
        JobEvent::Removed => panic!("removed"),
    }
    node.stop().await;
}

/// The promoter moves a scheduled job to pending after a panic (no
/// acceptor waits, so no dispatcher does it).
#[tokio::test(flavor = "multi_thread")]
async fn the_promoter_promotes_after_a_panic() {
    const T: &[u8] = b"sup_prom";
    let dir = tempfile::tempdir().unwrap();
    let (node, log) = embedded_node(dir.path());
    let jobs = node.jobs().clone();
    node.inject_panic(ServiceKind::Promoter, 1);
    log.wait("service_restarted", ServiceKind::Promoter, 1).await;
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let opts = JobOpts { schedule: Some(Schedule::RunAt(now_ms + 300)), ..JobOpts::default() };
    jobs.add_with(T, b"j", b"{}", &opts).await.expect("add");
    let promoted = eventually(Duration::from_secs(8), || async { pending_keys(&node, T).await == 1 }).await;
    assert!(promoted, "the restarted promoter moves the due job to pending");
    node.stop().await;
}

/// The pruner removes an ended job past its `keep` after a panic.
#[tokio::test(flavor = "multi_thread")]
async fn the_pruner_prunes_after_a_panic() {
    const T: &[u8] = b"sup_prune";
    let dir = tempfile::tempdir().unwrap();
    let (node, log) = embedded_node(dir.path());
    let _reg = register(&node, T, b"w").await;
    let jobs = node.jobs().clone();
    node.inject_panic(ServiceKind::Pruner, 1);
    log.wait("service_restarted", ServiceKind::Pruner, 1).await;
    let opts = JobOpts { keep: Some(Keep::Seconds(1)), ..JobOpts::default() };
    jobs.add_with(T, b"j", b"{}", &opts).await.expect("add");
    jobs.finish(&accept_now(&jobs, T, b"w").await.fence(), b"{}").await.expect("finish");
    let pruned = eventually(Duration::from_secs(10), || async { jobs.get(T, b"j").await.is_err() }).await;
    assert!(pruned, "the restarted pruner removes the job");
    node.stop().await;
}

/// The sweeper finishes the failover of a worker removed with more
/// running jobs than one transaction moves, after a panic.
#[tokio::test(flavor = "multi_thread")]
async fn the_sweeper_sweeps_after_a_panic() {
    const T: &[u8] = b"sup_sweep";
    const N: usize = 520;
    let dir = tempfile::tempdir().unwrap();
    let (node, log) = embedded_node(dir.path());
    let reg = register(&node, T, b"w").await;
    let jobs = node.jobs().clone();
    let many: Vec<NewJob> =
        (0..N).map(|i| NewJob { id: format!("j{i}").into_bytes(), info: b"{}".to_vec(), priority: 0 }).collect();
    jobs.add_many(T, &many).await.expect("add");
    for _ in 0..N {
        accept_now(&jobs, T, b"w").await;
    }
    node.inject_panic(ServiceKind::Sweeper, 1);
    log.wait("service_restarted", ServiceKind::Sweeper, 1).await;
    reg.unregister().await.expect("unregister");
    let swept = eventually(Duration::from_secs(20), || async { pending_keys(&node, T).await == N }).await;
    assert!(swept, "the restarted sweeper requeues the jobs beyond the first batch");
    node.stop().await;
}

/// A heartbeat service that keeps panicking is reported: logged at error
/// level, counted, and told to each registration's owner; it is still
/// restarted, and renews again once the panics stop.
#[tokio::test(flavor = "multi_thread")]
async fn a_failing_heartbeat_service_is_reported_to_the_owners() {
    const T: &[u8] = b"sup_fail";
    let dir = tempfile::tempdir().unwrap();
    let (node, log) = embedded_node(dir.path());
    let reg = node.register_worker(worker(T, b"w", 60)).await.expect("register");
    let (sender, mut owner) = mpsc::unbounded_channel();
    reg.listen(Box::new(move |e| {
        let _ = sender.send(e);
    }));
    let failing = SERVICES.snapshot().failing;
    node.inject_panic(ServiceKind::Heartbeat, 5);
    let told = tokio::time::timeout(Duration::from_secs(10), owner.recv()).await.expect("told in time").unwrap();
    assert_eq!(told, OwnerEvent::HeartbeatFailing);
    assert_eq!(log.count("service_failing", ServiceKind::Heartbeat), 1);
    assert!(log.count("service_restarted", ServiceKind::Heartbeat) >= 5);
    assert!(SERVICES.snapshot().failing > failing, "the failing episode is counted");
    // Restarted regardless: the sixth run serves.
    log.wait("service_restarted", ServiceKind::Heartbeat, 5).await;
    let other = node.register_worker(worker(T, b"v", 2)).await.expect("register");
    let key_v = ks(&node).health(T, b"v");
    let first = raw_get(&node, &key_v).await.expect("registered");
    let renewed =
        eventually(Duration::from_secs(15), || async { raw_get(&node, &key_v).await.is_some_and(|now| now != first) })
            .await;
    assert!(renewed, "the service renews again after the panics");
    drop(other);
    drop(reg);
    node.stop().await;
}
