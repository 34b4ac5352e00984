//! Job subscriptions: the current job, then every change with a greater
//! VS; `Removed` ends them; one store watch per (node, job).

mod jobs_common;

use std::time::Duration;

use couch_workers_core::jobs::{JobEvent, JobState};
use couch_workers_core::Error;
use jobs_common::*;

const T: &[u8] = b"indexer";

async fn subscribe_sees_each_state(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let other = c.node();
    let jobs = node.jobs();
    assert!(matches!(jobs.subscribe(T, b"nope", events().0).await, Err(Error::NotFound)));
    add(jobs, T, b"j", 0).await;
    let (on, mut rx) = events();
    let (current, _sub) = jobs.subscribe(T, b"j", on).await.unwrap();
    assert_eq!(current, get(jobs, T, b"j").await);
    assert_eq!(current.state, JobState::Pending);

    // Changes made through the other node arrive.
    let _w = register(&other, T, b"w").await;
    let h = accept_now(other.jobs(), T, b"w").await;
    let running = wait_state(&mut rx, JobState::Running).await;
    assert_eq!(running, h.job);
    let h2 = other.jobs().update(&h.fence(), br#"{"p":1}"#).await.unwrap();
    let updated = match next_event(&mut rx).await {
        JobEvent::Changed(job) => job,
        e => panic!("unexpected {e:?}"),
    };
    assert_eq!(updated, h2.job);
    assert!(updated.vs > running.vs);
    other.jobs().finish(&h2.fence(), br#"{"r":1}"#).await.unwrap();
    let finished = wait_state(&mut rx, JobState::Finished).await;
    assert_eq!(finished.result.as_deref(), Some(&br#"{"r":1}"#[..]));
    assert!(finished.vs > updated.vs);
    // A cancel of a finished job changes nothing: no event.
    jobs.cancel(T, b"j").await.unwrap();
    assert!(tokio::time::timeout(Duration::from_millis(200), rx.recv()).await.is_err(), "no change, no event");
    node.stop().await;
    other.stop().await;
}

async fn subscribe_and_wait_on_several(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let _w = register(&node, T, b"w").await;
    let mut rxs = Vec::new();
    let mut subs = Vec::new();
    for i in 0..3 {
        let id = format!("j{i}").into_bytes();
        add(jobs, T, &id, 0).await;
        let (on, rx) = events();
        let (_, sub) = jobs.subscribe(T, &id, on).await.unwrap();
        rxs.push(rx);
        subs.push(sub);
    }
    assert!(eventually(Duration::from_secs(2), || async { jobs.stats().job_watchers == 3 }).await);
    let worker = jobs.clone();
    tokio::spawn(async move {
        for _ in 0..3 {
            let h = worker.accept(T, b"w", Duration::from_secs(5)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            worker.finish(&h.fence(), b"{}").await.unwrap();
        }
    });
    for (i, rx) in rxs.iter_mut().enumerate() {
        let done = wait_state(rx, JobState::Finished).await;
        assert_eq!(done.id, format!("j{i}").into_bytes());
    }
    drop(subs);
    assert!(eventually(Duration::from_secs(2), || async { jobs.stats().job_watchers == 0 }).await);
    node.stop().await;
}

async fn remove_while_subscribed_ends_the_subscription(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let other = c.node();
    let jobs = node.jobs();
    add(jobs, T, b"j", 0).await;
    let (on, mut rx) = events();
    let (_, _sub) = jobs.subscribe(T, b"j", on).await.unwrap();
    other.jobs().remove(T, b"j").await.unwrap();
    assert_eq!(next_event(&mut rx).await, JobEvent::Removed);
    assert!(eventually(Duration::from_secs(2), || async { jobs.stats().job_watchers == 0 }).await);
    // Nothing after `Removed`, even if the id comes back.
    add(jobs, T, b"j", 0).await;
    assert!(tokio::time::timeout(Duration::from_millis(200), rx.recv()).await.map_or(true, |e| e.is_none()));
    node.stop().await;
    other.stop().await;
}

async fn subscribers_of_one_job_share_one_watch(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let _w = register(&node, T, b"w").await;
    add(jobs, T, b"j", 0).await;
    let mut subs = Vec::new();
    let mut rxs = Vec::new();
    for _ in 0..5 {
        let (on, rx) = events();
        subs.push(jobs.subscribe(T, b"j", on).await.unwrap().1);
        rxs.push(rx);
    }
    assert!(eventually(Duration::from_secs(2), || async { jobs.stats().job_watchers == 1 }).await);
    let h = accept_now(jobs, T, b"w").await;
    for rx in &mut rxs {
        assert_eq!(wait_state(rx, JobState::Running).await, h.job);
    }
    // An ended subscription gets nothing more; the others go on.
    let first = subs.remove(0);
    first.cancel();
    drop(first);
    let h2 = jobs.update(&h.fence(), br#"{"x":2}"#).await.unwrap();
    for rx in rxs.iter_mut().skip(1) {
        assert_eq!(next_event(rx).await, JobEvent::Changed(h2.job.clone()));
    }
    // Its callback was dropped with it: the channel closes, empty.
    assert_eq!(
        tokio::time::timeout(Duration::from_millis(200), rxs[0].recv()).await,
        Ok(None),
        "no event after cancel"
    );
    assert_eq!(jobs.stats().job_watchers, 1);
    drop(subs);
    assert!(eventually(Duration::from_secs(2), || async { jobs.stats().job_watchers == 0 }).await);
    node.stop().await;
}

async fn failover_is_seen_as_running_to_pending(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let reg = register(&node, T, b"w").await;
    add(jobs, T, b"j", 0).await;
    let h = accept_now(jobs, T, b"w").await;
    let (on, mut rx) = events();
    let (current, _sub) = jobs.subscribe(T, b"j", on).await.unwrap();
    assert_eq!(current, h.job);
    node.unregister_worker(&reg).await.unwrap();
    let back = wait_state(&mut rx, JobState::Pending).await;
    assert_eq!(back.worker, None);
    assert_eq!(back.attempts, 1);
    assert!(back.vs > h.job.vs);
    node.stop().await;
}

couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread"),
    stores: [embedded: Embedded],
    tests: [
        subscribe_sees_each_state,
        subscribe_and_wait_on_several,
        remove_while_subscribed_ends_the_subscription,
        subscribers_of_one_job_share_one_watch,
        failover_is_seen_as_running_to_pending,
    ],
);
