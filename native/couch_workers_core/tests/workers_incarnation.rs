//! Each registration is an incarnation of its worker id. What is
//! done for one (its removal, its heartbeat, the requeue of its jobs) must
//! never touch another registration of the same id, on this node or any.
//! Through the public `Node` API only, as the NIF uses it.

mod jobs_common;

use std::sync::Arc;
use std::time::Duration;

use couch_workers_core::jobs::JobState;
use couch_workers_core::log::Discard;
use couch_workers_core::store::faulty::{FaultPlan, FaultyStore};
use couch_workers_core::store::Db;
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Node, Settings};
use jobs_common::*;

const T: &[u8] = b"replicator";

fn spec_of(options: &[u8], timeout_s: u64) -> WorkerSpec {
    WorkerSpec { worker_type: T.to_vec(), id: b"w".to_vec(), options_json: options.to_vec(), timeout_s }
}

/// Every commit fails with an I/O error while enabled: a store that turns
/// an unregister down.
fn failing_commits() -> FaultPlan {
    FaultPlan {
        seed: 12,
        create: 0.0,
        read: 0.0,
        write: 0.0,
        commit: 1.0,
        watch: 0.0,
        io_share: 1.0,
        unknown_committed_share: 0.0,
        enabled: false,
    }
}

/// A node on `c`'s directory whose commits can be made to fail.
fn faulty_node(c: &Cluster) -> (Arc<Node>, Arc<FaultyStore>) {
    let inner: Db = c.db();
    let faulty = FaultyStore::wrap(inner, failing_commits());
    (Node::with_db(faulty.clone(), Settings::default(), Arc::new(Discard)), faulty)
}

async fn a_stale_handle_does_not_remove_the_next_registration(store: StoreKind) {
    let c = Cluster::on(store);
    let (node, faulty) = faulty_node(&c);
    let observer = c.node();
    let old = node.register_worker(spec_of(br#"{"n":1}"#, 15)).await.expect("register");
    faulty.set_enabled(true);
    assert!(node.unregister_worker(&old).await.is_err(), "the store turned the unregister down");
    faulty.set_enabled(false);
    // The owner registers again (the Erlang side forgets a handle whose
    // unregister failed), and the new registration takes a job.
    let new = node.register_worker(spec_of(br#"{"n":2}"#, 15)).await.expect("register again");
    add(node.jobs(), T, b"j", 0).await;
    let h = accept_now(node.jobs(), T, b"w").await;

    drop(old);
    // `stop` waits for every task of the node, the old handle's removal too.
    node.stop().await;
    drop(new);

    assert_eq!(
        raw_get(&observer, &ks(&observer).member(T, b"w")).await,
        Some(br#"{"n":2}"#.to_vec()),
        "still registered"
    );
    let job = get(observer.jobs(), T, b"j").await;
    assert_eq!((job.state, job.worker), (JobState::Running, Some(b"w".to_vec())), "its job was not requeued");
    assert_eq!(job.vs, h.job.vs, "nor touched");
    observer.stop().await;
}

async fn two_registrations_of_one_id_do_not_keep_each_other_alive(store: StoreKind) {
    let c = Cluster::on(store);
    let (a, b) = (c.node(), c.node());
    let _first = a.register_worker(spec_of(b"{}", 1)).await.expect("register on a");
    let _second = b.register_worker(spec_of(b"{}", 1)).await.expect("register on b, replacing a's");
    // b's node dies: nothing heartbeats its registration any more, and
    // nothing removes it but a reaper.
    b.stop().await;
    let member = ks(&a).member(T, b"w");
    assert!(
        eventually(Duration::from_secs(5), || async { raw_get(&a, &member).await.is_none() }).await,
        "a's heartbeats kept b's registration alive"
    );
    assert_eq!(a.stats().heartbeats, 0, "a's heartbeat stopped: its registration is gone");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(raw_get(&a, &member).await, None, "and nothing brings it back");
    a.stop().await;
}

/// An acceptor still waiting for a registration that has
/// ended (unregistered here, then registered again under the same id)
/// takes nothing of the next registration's: it gets `NotFound` when a job
/// comes, and the job stays pending for the new registration. Also when
/// the new registration is another node's.
async fn a_waiting_accept_takes_nothing_for_the_next_registration(store: StoreKind) {
    let c = Cluster::on(store);
    let (a, b) = (c.node(), c.node());
    for next_on in [&a, &b] {
        let old = a.register_worker(spec_of(b"{}", 15)).await.expect("register");
        let inc = *old.incarnation();
        let n = a.clone();
        let waiting =
            tokio::spawn(async move { n.jobs().accept_registered(T, b"w", Some(inc), Duration::from_secs(20)).await });
        assert!(eventually(Duration::from_secs(5), || async { a.jobs().stats().waiters == 1 }).await, "waiting");
        a.unregister_worker(&old).await.expect("unregister");
        let new = next_on.register_worker(spec_of(b"{}", 15)).await.expect("register again");
        add(next_on.jobs(), T, b"j", 0).await;
        let answer = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("answered").expect("task");
        assert_eq!(answer.map(|h| h.job.id), Err(couch_workers_core::Error::NotFound));
        let job = get(a.jobs(), T, b"j").await;
        assert_eq!((job.state, job.attempts), (JobState::Pending, 0), "the job was left for the new registration");
        // The new registration's own accepts (by incarnation, and by id)
        // take it.
        let h =
            next_on.jobs().accept_registered(T, b"w", Some(*new.incarnation()), Duration::ZERO).await.expect("taken");
        assert_eq!(h.job.id, b"j".to_vec());
        next_on.jobs().remove(T, b"j").await.expect("remove");
        next_on.unregister_worker(&new).await.expect("unregister the new one");
    }
    a.stop().await;
    b.stop().await;
}

/// The same check on the accept that does not wait: an accept for an
/// incarnation that no longer holds the id finds nothing, while one for
/// the id (no incarnation) still takes the job.
async fn an_accept_for_an_ended_incarnation_finds_nothing(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let old = node.register_worker(spec_of(b"{}", 15)).await.expect("register");
    let stale = *old.incarnation();
    node.unregister_worker(&old).await.expect("unregister");
    let _new = node.register_worker(spec_of(b"{}", 15)).await.expect("register again");
    add(node.jobs(), T, b"j", 0).await;
    assert_eq!(
        node.jobs().accept_registered(T, b"w", Some(stale), Duration::ZERO).await.map(|h| h.job.id),
        Err(couch_workers_core::Error::NotFound)
    );
    assert_eq!(get(node.jobs(), T, b"j").await.state, JobState::Pending);
    assert!(node.jobs().accept(T, b"w", Duration::ZERO).await.is_ok(), "by id alone: whichever registration holds it");
    node.stop().await;
}

couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread"),
    stores: [embedded: Embedded],
    tests: [
        a_stale_handle_does_not_remove_the_next_registration,
        two_registrations_of_one_id_do_not_keep_each_other_alive,
        a_waiting_accept_takes_nothing_for_the_next_registration,
        an_accept_for_an_ended_incarnation_finds_nothing,
    ],
);
