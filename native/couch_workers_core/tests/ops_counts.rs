//! The counts the core hands to operations' metrics: a reap says how many
//! running jobs it failed over (the reaper logs it as `worker_reaped`'s
//! `jobs`, which the app counts as `jobs_requeued`).

mod jobs_common;

use couch_workers_core::jobs::JobState;
use couch_workers_core::roster;
use couch_workers_core::store::{run, TxOptions};
use jobs_common::*;

const T: &[u8] = b"indexer";

#[tokio::test(flavor = "multi_thread")]
async fn a_reap_says_how_many_running_jobs_it_failed_over() {
    let c = Cluster::new();
    let (node, reaper) = (c.node(), c.node());
    let _reg = register(&node, T, b"w").await;
    for id in [&b"j1"[..], b"j2", b"j3"] {
        add(node.jobs(), T, id, 0).await;
    }
    let _h1 = accept_now(node.jobs(), T, b"w").await;
    let _h2 = accept_now(node.jobs(), T, b"w").await;

    let observed = raw_get(&reaper, &ks(&reaper).health(T, b"w")).await.expect("a health record");
    let reap = || {
        let (kss, observed) = (ks(&reaper).clone(), observed.clone());
        run(reaper.db().as_ref(), TxOptions::write(), move |tx| {
            let (kss, observed) = (kss.clone(), observed.clone());
            async move { roster::reap_with_jobs(&tx, &kss, T, b"w", &observed).await }
        })
    };
    assert_eq!(reap().await.expect("reap"), Some(2), "two running jobs failed over");
    assert_eq!(get(reaper.jobs(), T, b"j1").await.state, JobState::Pending);
    assert_eq!(get(reaper.jobs(), T, b"j2").await.state, JobState::Pending);
    // Gone now (its heartbeat may bring it back, as a new record): this
    // record reaps nothing more.
    assert_eq!(reap().await.expect("reap again"), None);
    node.stop().await;
    reaper.stop().await;
}
