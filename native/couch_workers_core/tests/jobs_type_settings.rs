//! A job type's settings (`job_type_get/1`, `job_type_set/2`): defaults,
//! partial changes, refusals that write nothing, one type's settings apart
//! from another's, the dispatchers' wake-up on a limit's change, and two
//! nodes changing different settings at once. On every store.

mod jobs_common;

use couch_workers_core::jobs::{TypeSetting, TypeSettings};
use couch_workers_core::Error;
use jobs_common::*;

const T: &[u8] = b"replication";

async fn defaults_changes_and_refusals(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    assert_eq!(jobs.type_settings(T).await.unwrap(), TypeSettings::default());
    assert_eq!(raw_get(&node, &ks(&node).type_settings(T)).await, None, "a read writes nothing");

    let set =
        jobs.set_type_settings(T, &[TypeSetting::MaxRunning(Some(8)), TypeSetting::ActivityTimeout(Some(30))]).await;
    let want = TypeSettings { activity_timeout: Some(30), max_running: Some(8), max_running_per_group: None };
    assert_eq!(set.unwrap(), want);
    assert_eq!(jobs.type_settings(T).await.unwrap(), want);

    // Settings not named keep their values; `None` sets infinity.
    let set =
        jobs.set_type_settings(T, &[TypeSetting::MaxRunningPerGroup(Some(2)), TypeSetting::MaxRunning(None)]).await;
    let want = TypeSettings { activity_timeout: Some(30), max_running: None, max_running_per_group: Some(2) };
    assert_eq!(set.unwrap(), want);
    assert_eq!(jobs.type_settings(T).await.unwrap(), want);

    // A bad value refuses the whole change: nothing is written.
    let stored = raw_get(&node, &ks(&node).type_settings(T)).await;
    let bad =
        jobs.set_type_settings(T, &[TypeSetting::ActivityTimeout(Some(5)), TypeSetting::MaxRunning(Some(0))]).await;
    assert_eq!(bad, Err(Error::Invalid("bad_max_running")));
    assert_eq!(raw_get(&node, &ks(&node).type_settings(T)).await, stored);
    assert_eq!(jobs.type_settings(T).await.unwrap(), want);

    // Another type, and a type whose name is a prefix of this one's.
    assert_eq!(jobs.type_settings(b"repl").await.unwrap(), TypeSettings::default());
    assert_eq!(jobs.type_settings(b"replication\0").await.unwrap(), TypeSettings::default());

    // A key too large is refused before anything is read or written.
    let huge = vec![b't'; 20_000];
    assert_eq!(
        jobs.type_settings(&huge).await.map(|_| ()),
        Err(Error::Store(couch_workers_core::store::StoreError::KeyTooLarge))
    );
    node.stop().await;
}

/// A change of a running limit moves the type's `jobs_vs` (every node's
/// dispatcher watches it: a raised limit serves waiting acceptors at
/// once); a change of the timeout alone, or no change, does not.
async fn a_limit_change_wakes_the_dispatchers(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let key = ks(&node).jobs_vs(T);
    jobs.set_type_settings(T, &[TypeSetting::ActivityTimeout(Some(9))]).await.unwrap();
    let before = raw_get(&node, &key).await;
    assert_eq!(before, None, "a timeout change wakes nobody");
    jobs.set_type_settings(T, &[TypeSetting::MaxRunning(Some(4))]).await.unwrap();
    let after = raw_get(&node, &key).await;
    assert!(after.is_some() && after != before, "a limit change bumps jobs_vs");
    jobs.set_type_settings(T, &[TypeSetting::MaxRunning(Some(4))]).await.unwrap();
    assert_eq!(raw_get(&node, &key).await, after, "the same value again writes nothing");
    jobs.set_type_settings(T, &[TypeSetting::MaxRunningPerGroup(Some(1))]).await.unwrap();
    assert_ne!(raw_get(&node, &key).await, after, "a per-group limit change bumps it too");
    node.stop().await;
}

/// Two nodes change different settings of one type at once, many times:
/// each change reads the stored settings in its own transaction, so none
/// is lost.
async fn concurrent_changes_of_different_settings_all_land(store: StoreKind) {
    let c = Cluster::on(store);
    let (a, b) = (c.node(), c.node());
    let (ja, jb) = (a.jobs(), b.jobs());
    for i in 1..=20u64 {
        let (ca, cb) = ([TypeSetting::MaxRunning(Some(i))], [TypeSetting::ActivityTimeout(Some(100 + i))]);
        let (ra, rb) = tokio::join!(ja.set_type_settings(T, &ca), jb.set_type_settings(T, &cb));
        ra.unwrap();
        rb.unwrap();
        let now = ja.type_settings(T).await.unwrap();
        assert_eq!((now.max_running, now.activity_timeout), (Some(i), Some(100 + i)), "round {i}");
    }
    a.stop().await;
    b.stop().await;
}

couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread"),
    stores: [embedded: Embedded, sim: Sim],
    tests: [
        defaults_changes_and_refusals,
        a_limit_change_wakes_the_dispatchers,
        concurrent_changes_of_different_settings_all_land,
    ],
);
