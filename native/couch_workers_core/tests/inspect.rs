//! Operations' reads (`inspect.rs`): node A sees, from the store, the
//! worker types and the workers that node B registered, with their
//! options, timeouts, heartbeat ages and running jobs.

mod jobs_common;

use std::time::Duration;

use couch_workers_core::workers::WorkerSpec;
use jobs_common::*;

fn spec_with(t: &[u8], id: &[u8], options: &[u8], timeout_s: u64) -> WorkerSpec {
    WorkerSpec { worker_type: t.to_vec(), id: id.to_vec(), options_json: options.to_vec(), timeout_s }
}

#[tokio::test(flavor = "multi_thread")]
async fn another_nodes_workers_are_seen_with_options_timeout_age_and_running_jobs() {
    let c = Cluster::new();
    let (a, a_store) = c.node_and_store();
    let b = c.node();
    let w1 = b.register_worker(spec_with(b"indexer", b"b-1", br#"{"slots":4}"#, 7)).await.unwrap();
    let _w2 = b.register_worker(spec_with(b"indexer", b"b-2", b"{}", 15)).await.unwrap();
    let _r = b.register_worker(spec_with(b"replicator", b"b-3", b"{}", 15)).await.unwrap();
    for id in [&b"j1"[..], b"j2", b"j3"] {
        add(b.jobs(), b"indexer", id, 0).await;
    }
    let _h1 = accept_now(b.jobs(), b"indexer", b"b-1").await;
    let _h2 = accept_now(b.jobs(), b"indexer", b"b-1").await;

    assert_eq!(a.context().worker_types().await.unwrap(), vec![b"indexer".to_vec(), b"replicator".to_vec()]);
    let ws = a.context().workers(b"indexer").await.unwrap();
    assert_eq!(ws.len(), 2);
    assert_eq!((ws[0].id.as_slice(), ws[0].options_json.as_slice()), (&b"b-1"[..], &br#"{"slots":4}"#[..]));
    assert_eq!((ws[0].timeout_s, ws[0].running), (Some(7), 2));
    assert_eq!((ws[1].id.as_slice(), ws[1].timeout_s, ws[1].running), (&b"b-2"[..], Some(15), 0));
    // Fresh heartbeats: registered just now (generous: a loaded machine).
    for w in &ws {
        assert!(w.heartbeat_age_ms.unwrap() < 5_000, "{w:?}");
    }
    // The age is read on the store's versions: 20 s of them pass at once.
    a_store.jump_versions(Duration::from_secs(20));
    let aged = a.context().workers(b"indexer").await.unwrap();
    assert!(aged.iter().all(|w| w.heartbeat_age_ms.unwrap() >= 20_000), "{aged:?}");

    // A type whose last worker left is no longer listed; its workers are [].
    b.unregister_worker(&w1).await.unwrap();
    let ws = a.context().workers(b"indexer").await.unwrap();
    assert_eq!(ws.iter().map(|w| w.id.clone()).collect::<Vec<_>>(), vec![b"b-2".to_vec()]);
    drop(_r);
    assert!(
        eventually(Duration::from_secs(5), || async {
            a.context().worker_types().await.unwrap() == vec![b"indexer".to_vec()]
        })
        .await
    );
    assert!(a.context().workers(b"replicator").await.unwrap().is_empty());
    assert!(a.context().workers(b"never-registered").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn types_named_like_subspaces_and_prefixes_of_each_other_are_kept_apart() {
    let c = Cluster::new();
    let a = c.node();
    // "w" is a byte prefix of "w\0x" and "wx"; "jobs" names a subspace.
    let mut regs = Vec::new();
    for t in [&b"w"[..], b"w\0x", b"wx", b"jobs", b"active"] {
        regs.push(a.register_worker(spec_with(t, b"1", b"{}", 15)).await.unwrap());
    }
    let expected: Vec<Vec<u8>> = [&b"active"[..], b"jobs", b"w", b"w\0x", b"wx"].iter().map(|t| t.to_vec()).collect();
    assert_eq!(a.context().worker_types().await.unwrap(), expected);
    for t in &expected {
        assert_eq!(a.context().workers(t).await.unwrap().len(), 1, "{t:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn more_workers_than_a_page_are_all_read() {
    let c = Cluster::new();
    let a = c.node();
    let n = couch_workers_core::inspect::PAGE * 2 + 7;
    let mut regs = Vec::with_capacity(n);
    for i in 0..n {
        regs.push(a.register_worker(spec_with(b"big", format!("{i:05}").as_bytes(), b"{}", 600)).await.unwrap());
    }
    let ws = a.context().workers(b"big").await.unwrap();
    assert_eq!(ws.len(), n);
    assert!(ws.windows(2).all(|p| p[0].id < p[1].id));
    assert!(ws.iter().all(|w| w.timeout_s == Some(600)));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_type_over_the_key_limit_is_key_too_large() {
    let c = Cluster::new();
    let a = c.node();
    let e = a.context().workers(&vec![b'x'; 10_001]).await.unwrap_err();
    assert_eq!(e.name(), "key_too_large");
}

#[tokio::test(flavor = "multi_thread")]
async fn another_nodes_pause_and_resume_are_seen() {
    let c = Cluster::new();
    let (a, b) = (c.node(), c.node());
    assert!(!a.context().job_paused(b"t").await.unwrap(), "never paused");
    b.jobs().set_paused(b"t", true).await.unwrap();
    assert!(a.context().job_paused(b"t").await.unwrap());
    assert!(!a.context().job_paused(b"t\0").await.unwrap(), "a type that only starts like it");
    b.jobs().set_paused(b"t", false).await.unwrap();
    assert!(!a.context().job_paused(b"t").await.unwrap());
    assert_eq!(a.context().job_paused(&vec![b'x'; 10_001]).await.unwrap_err().name(), "key_too_large");
}
