//! I1, an idle node: the promoter and the pruner sleep until the earliest
//! moment they know of work, woken by a change (`scheduled_vs`,
//! `expiry_vs`), not on a short timer. These tests check that sleeping
//! long misses nothing: work that appears while they sleep is done about
//! as soon as before (their timers' cap is now 30 s, so a missed wake-up
//! shows as a delay of that order).

mod jobs_common;

use std::time::{Duration, Instant};

use couch_workers_core::jobs::{ops, wall_ms, JobOpts, JobSpec, JobState, Keep, Schedule};
use couch_workers_core::keyspace::Keyspace;
use couch_workers_core::store::{run, Db, TxOptions};
use jobs_common::*;

/// Long enough for a node's services to finish their first passes and
/// fall asleep.
const SETTLE: Duration = Duration::from_millis(1500);

/// A job of a type nobody had scheduled before, added by another process
/// (a bare store handle: no node of its own promotes it) while the node's
/// promoter sleeps: promoted within about a second of its `run_at`.
async fn a_new_types_scheduled_job_added_elsewhere_is_promoted_on_time(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    tokio::time::sleep(SETTLE).await;
    let db: Db = c.db();
    let ks = &Keyspace::new(&db.prefix());
    let due_at = wall_ms() + 300;
    let spec = [JobSpec {
        id: b"j".to_vec(),
        info: b"{}".to_vec(),
        opts: JobOpts { schedule: Some(Schedule::RunAt(due_at)), ..JobOpts::default() },
    }];
    let s = &spec;
    run(db.as_ref(), TxOptions::write(), |tx| async move { ops::add_many_jobs(&tx, ks, b"fresh", s, wall_ms()).await })
        .await
        .expect("add")
        .expect("added");
    assert!(
        eventually(Duration::from_secs(40), || async { pending_keys(&node, b"fresh").await == 1 }).await,
        "never promoted"
    );
    let late = wall_ms().saturating_sub(due_at);
    eprintln!("promoted {late} ms after its run_at");
    assert!(wall_ms() >= due_at, "never early");
    // About a second is the promise; 5 s is generous for a loaded machine
    // and far below the 30 s of a missed wake-up.
    assert!(late < 5_000, "promoted {late} ms after its run_at");
    node.stop().await;
}

/// A job ended with a short `keep` while the pruner sleeps is pruned
/// within the API's 5 s of its expiry; a long `keep` wakes nobody.
async fn a_short_kept_job_is_pruned_on_time_and_a_long_kept_one_wakes_nobody(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let ks = node.keyspace().clone();
    let _reg = register(&node, b"k", b"w").await;
    let keep = |s| JobOpts { keep: Some(Keep::Seconds(s)), ..JobOpts::default() };
    jobs.add_with(b"k", b"long", b"{}", &keep(3600)).await.unwrap();
    jobs.finish(&accept_now(jobs, b"k", b"w").await.fence(), b"{}").await.unwrap();
    assert_eq!(raw_get(&node, &ks.expiry_vs()).await, None, "a keep of an hour wakes no pruner");
    tokio::time::sleep(SETTLE).await;
    jobs.add_with(b"k", b"short", b"{}", &keep(1)).await.unwrap();
    jobs.finish(&accept_now(jobs, b"k", b"w").await.fence(), b"{}").await.unwrap();
    let ended = Instant::now();
    assert!(raw_get(&node, &ks.expiry_vs()).await.is_some(), "a keep of 1 s wakes the pruners");
    assert!(
        eventually(Duration::from_secs(40), || async { jobs.get(b"k", b"short").await.is_err() }).await,
        "never pruned"
    );
    let took = ended.elapsed();
    eprintln!("pruned {took:?} after its end (keep 1 s)");
    assert!(took < Duration::from_secs(6), "pruned {took:?} after its end: more than 5 s after its expiry");
    assert_eq!(get(jobs, b"k", b"long").await.state, JobState::Finished);
    drop(_reg);
    node.stop().await;
}

couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread"),
    stores: [embedded: Embedded],
    tests: [
        a_new_types_scheduled_job_added_elsewhere_is_promoted_on_time,
        a_short_kept_job_is_pruned_on_time_and_a_long_kept_one_wakes_nobody,
    ],
);
