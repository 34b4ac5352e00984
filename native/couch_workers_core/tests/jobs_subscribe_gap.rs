//! Job subscriptions: a job removed and added again with the same id
//! between two reads of its watcher is another job, told by its
//! incarnation (`jobs/subscription.rs`). Apart from
//! `tests/jobs_subscribe.rs`; these run on a live FoundationDB too
//! (`scripts/live-cargo-test.sh` runs every ignored test of the binaries
//! it is given, and fails on any that fails).

mod jobs_common;

use std::sync::Arc;
use std::time::Duration;

use couch_workers_core::jobs::{ops, JobEvent, JobOpts, JobState, NewJob};
use couch_workers_core::store::{run, TxOptions};
use couch_workers_core::Node;
use jobs_common::*;

const T: &[u8] = b"indexer";

/// Removes the job `id` and adds another with that id and `info`, in one
/// transaction: no read can see it absent.
async fn remove_and_add_again(node: &Arc<Node>, id: &[u8], info: &[u8]) {
    let ks = ks(node).clone();
    let k = &ks;
    let again = NewJob { id: id.to_vec(), info: info.to_vec(), priority: 0 };
    let a = &again;
    run(node.db().as_ref(), TxOptions::write(), |tx| async move {
        ops::remove(&tx, k, T, id).await?.expect("removed");
        ops::add(&tx, k, T, a).await?.expect("added");
        Ok(())
    })
    .await
    .expect("remove and add");
}

/// The old job's subscribers get `Removed`, not a change to the new job,
/// and their subscription ends (nothing of the new job reaches them, and
/// the watcher goes); a subscription to the new job follows it. Failed
/// with a `Changed` of the new job before records carried incarnations.
async fn remove_and_add_again_between_two_reads_tells_removed(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    add(jobs, T, b"j", 0).await;
    let (on, mut rx) = events();
    let (old, _sub) = jobs.subscribe(T, b"j", on).await.unwrap();
    remove_and_add_again(&node, b"j", b"{\"new\":1}").await;
    assert_eq!(next_event(&mut rx).await, JobEvent::Removed, "the job subscribed to is gone");
    assert!(eventually(Duration::from_secs(2), || async { jobs.stats().job_watchers == 0 }).await);

    let (on, mut new_rx) = events();
    let (new, _new_sub) = jobs.subscribe(T, b"j", on).await.unwrap();
    assert_eq!(new.info, b"{\"new\":1}");
    assert!(new.incarnation.is_some() && new.incarnation != old.incarnation, "another job");
    let _w = register(&node, T, b"w").await;
    let h = accept_now(jobs, T, b"w").await;
    assert_eq!(wait_state(&mut new_rx, JobState::Running).await, h.job);
    assert_eq!(h.job.incarnation, new.incarnation, "an accept keeps the incarnation");
    let h2 = jobs.update(&h.fence(), br#"{"p":1}"#).await.unwrap();
    assert_eq!(next_event(&mut new_rx).await, JobEvent::Changed(h2.job.clone()));
    assert_eq!(h2.job.incarnation, new.incarnation, "an update keeps it");
    // The old subscription ended with `Removed`: nothing since.
    assert!(rx.try_recv().is_err(), "nothing after Removed");
    node.stop().await;
}

/// Subscribers of the old job and of the new one on one node: the first
/// get `Removed`, the others go on (with the same watcher, or a new one if
/// the old one had ended already) and see the new job's changes.
async fn subscribers_of_the_new_job_go_on(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    add(jobs, T, b"j", 0).await;
    let (on, mut old_rx) = events();
    let (_, _old_sub) = jobs.subscribe(T, b"j", on).await.unwrap();
    remove_and_add_again(&node, b"j", b"{\"new\":1}").await;
    let (on, mut new_rx) = events();
    let (new, _new_sub) = jobs.subscribe(T, b"j", on).await.unwrap();
    assert_eq!(new.info, b"{\"new\":1}");
    assert_eq!(next_event(&mut old_rx).await, JobEvent::Removed);
    jobs.resubmit(T, b"j", b"{\"newer\":1}", &JobOpts::default(), None).await.unwrap();
    let changed = match next_event(&mut new_rx).await {
        JobEvent::Changed(job) => job,
        e => panic!("unexpected {e:?}"),
    };
    assert_eq!(changed.info, b"{\"newer\":1}");
    assert_eq!(changed.incarnation, new.incarnation, "a resubmit keeps the incarnation");
    assert!(old_rx.try_recv().is_err(), "nothing after Removed");
    node.stop().await;
}

/// A subscriber that joins the old job's watcher while that watcher's
/// read of the old job is in flight: the read, older than what the
/// subscriber has seen, tells it nothing. Failed before the watcher
/// skipped such reads (on the embedded store in the second round: the new
/// job's subscriber was told `Removed`, its incarnation compared with the
/// old job's; a read that found no job told it `Removed` too).
async fn a_read_older_than_a_subscriber_tells_it_nothing(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    for round in 0..100 {
        let id = format!("r{round}");
        let id = id.as_bytes();
        add(jobs, T, id, 0).await;
        let (on, mut old_rx) = events();
        let (_, _old_sub) = jobs.subscribe(T, id, on).await.unwrap();
        if round % 2 == 0 {
            remove_and_add_again(&node, id, b"{\"new\":1}").await;
        } else {
            // Two transactions: the watcher may read the job absent.
            jobs.remove(T, id).await.unwrap();
            jobs.add(T, id, b"{\"new\":1}", 0).await.unwrap();
        }
        let (on, mut new_rx) = events();
        let (new, _new_sub) = jobs.subscribe(T, id, on).await.unwrap();
        assert_eq!(new.info, b"{\"new\":1}");
        assert_eq!(next_event(&mut old_rx).await, JobEvent::Removed);
        jobs.resubmit(T, id, b"{\"newer\":1}", &JobOpts::default(), None).await.unwrap();
        match next_event(&mut new_rx).await {
            JobEvent::Changed(job) => assert_eq!(job.info, b"{\"newer\":1}", "round {round}"),
            e => panic!("round {round}: unexpected {e:?}"),
        }
    }
    node.stop().await;
}

/// Subscribers that read the job just before a removal and join its
/// watcher around the watcher's read of the removal are all told
/// `Removed`, whichever side of that read they joined on (one that joined
/// while it was in flight is told by the read after it: no change would
/// fire the watch again).
async fn a_subscriber_joining_around_a_removal_is_told(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    for round in 0..100 {
        let id = format!("s{round}").into_bytes();
        add(jobs, T, &id, 0).await;
        let (on, mut first_rx) = events();
        let (_, _first) = jobs.subscribe(T, &id, on).await.unwrap();
        let (n, joining_id) = (node.clone(), id.clone());
        let joining = tokio::spawn(async move {
            let (on, rx) = events();
            n.jobs().subscribe(T, &joining_id, on).await.map(|(_, sub)| (sub, rx))
        });
        jobs.remove(T, &id).await.unwrap();
        assert_eq!(next_event(&mut first_rx).await, JobEvent::Removed, "round {round}");
        match joining.await.unwrap() {
            Ok((_sub, mut rx)) => assert_eq!(next_event(&mut rx).await, JobEvent::Removed, "round {round}"),
            Err(e) => assert!(matches!(e, couch_workers_core::Error::NotFound), "round {round}: {e:?}"),
        }
    }
    node.stop().await;
}

couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread"),
    stores: [embedded: Embedded, sim: Sim],
    tests: [
        remove_and_add_again_between_two_reads_tells_removed,
        subscribers_of_the_new_job_go_on,
        a_read_older_than_a_subscriber_tells_it_nothing,
        a_subscriber_joining_around_a_removal_is_told,
    ],
);
