//! Resource leaks at the Rust level, on the embedded store: many
//! register/unregister cycles and many membership watch start/stop cycles.
//! Afterwards the node's live task counts (`Node::stats`: heartbeats,
//! watchers) and the store's pending watches
//! (`EmbeddedStore::pending_watches`) are back at their starting values,
//! the membership is empty, and the process's resident memory has not
//! grown by more than a generous bound (it is printed, not held to a tight
//! one: allocators keep freed memory).
//!
//! Each test runs 100,000 cycles or as many as fit in its time budget
//! (default 3 s, so that the suite stays fast), and prints the count.
//! The full run is one command:
//!
//! ```text
//! CW_LEAK_SECS=600 cargo test --release -p couch_workers_core --test faults_leaks -- --nocapture --test-threads=1
//! ```
//!
//! (`CW_LEAK_CYCLES` changes the 100,000.)

mod faults_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use couch_workers_core::log::Discard;
use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Node, Settings, Stats};
use faults_common::*;
use tokio::sync::mpsc;

const T: &[u8] = b"indexer";

/// The two tests measure one process's memory: never at the same time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn budget() -> (u64, Duration) {
    (env_or("CW_LEAK_CYCLES", 100_000u64), Duration::from_secs_f64(env_or("CW_LEAK_SECS", 3.0f64)))
}

fn spec(id: u64) -> WorkerSpec {
    WorkerSpec {
        worker_type: T.to_vec(),
        id: format!("w{id}").into_bytes(),
        options_json: b"{\"cap\":1}".to_vec(),
        timeout_s: 15,
    }
}

fn open(dir: &std::path::Path) -> (Arc<EmbeddedStore>, Arc<Node>) {
    let store = EmbeddedStore::open(EmbeddedOptions::new(dir)).expect("open the store");
    let settings = Settings { reaper_max_interval: Duration::from_millis(500), ..Settings::default() };
    let node = Node::with_db(store.clone(), settings, Arc::new(Discard));
    (store, node)
}

/// Waits up to 15 s (a loaded machine runs the background removals
/// late) for the node's counts and the store's pending watches to come
/// back to `start`.
async fn settle(node: &Node, store: &EmbeddedStore, start: (Stats, usize)) -> (Stats, usize) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let now = (node.stats(), store.pending_watches());
        if now == start || Instant::now() >= deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The store's pending watches once they stay the same for 300 ms (the
/// store sweeps dropped watches every 100 ms).
async fn steady_watches(store: &EmbeddedStore) -> usize {
    let mut last = store.pending_watches();
    let mut same_since = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(3);
    while same_since.elapsed() < Duration::from_millis(300) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = store.pending_watches();
        if now != last {
            last = now;
            same_since = Instant::now();
        }
    }
    last
}

async fn members(node: &Node) -> usize {
    snapshot(node.db().as_ref(), node.keyspace()).await.members_of(T).len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_unregister_cycles_leave_no_task_watch_or_member() {
    let _serial = SERIAL.lock().await;
    count_panics();
    let dir = tempfile::tempdir().expect("temp dir");
    let (store, node) = open(dir.path());
    // What the node's own tasks watch (the orphan sweeper), before any
    // worker or watcher existed.
    let baseline = (node.stats(), steady_watches(&store).await);
    // Warm up (statement caches, pools, the allocator), then measure.
    for i in 0..200 {
        let reg = node.register_worker(spec(i)).await.expect("register");
        node.unregister_worker(&reg).await.expect("unregister");
    }
    let start = settle(&node, &store, baseline).await;
    assert_eq!(start, baseline, "the warm-up left nothing behind");
    let rss_before = rss_bytes();
    let (cycles, secs) = budget();
    let t0 = Instant::now();
    let mut done = 0u64;
    let mut peak_heartbeats = 0;
    while done < cycles && t0.elapsed() < secs {
        let reg = node.register_worker(spec(done % 1000)).await.expect("register");
        peak_heartbeats = peak_heartbeats.max(node.stats().heartbeats);
        if done % 10 == 9 {
            // The owner goes away without unregistering: the drop removes
            // the worker in the background.
            drop(reg);
        } else {
            node.unregister_worker(&reg).await.expect("unregister");
        }
        done += 1;
    }
    let elapsed = t0.elapsed();
    let end = settle(&node, &store, start).await;
    let rss_after = rss_bytes();
    eprintln!(
        "register/unregister: {done} cycles in {elapsed:.1?} ({:.0}/s; every 10th by drop); \
         heartbeat tasks: start {}, peak {peak_heartbeats}, end {}; pending store watches: start {}, end {}; \
         RSS {:.1} MB -> {:.1} MB ({:+.1} MB)",
        done as f64 / elapsed.as_secs_f64(),
        start.0.heartbeats,
        end.0.heartbeats,
        start.1,
        end.1,
        mb(rss_before),
        mb(rss_after),
        mb(rss_after) - mb(rss_before),
    );
    assert!(done >= 1_000, "too few cycles to say anything: {done}");
    assert_eq!(end, start, "task counts and pending watches back to their starting values");
    // The drops' removals run in the background: wait for the last ones.
    let deadline = Instant::now() + Duration::from_secs(15);
    while members(&node).await != 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(members(&node).await, 0, "no worker left registered");
    snapshot(node.db().as_ref(), node.keyspace()).await.assert_ok("after the cycles");
    assert!(rss_after < rss_before + 100 * 1024 * 1024, "RSS grew by more than 100 MB");
    node.stop().await;
    assert_eq!(node.stats(), Stats { heartbeats: 0, watchers: 0, reapers: 0 });
    assert_eq!(panics(), 0, "no panic in any background task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_watch_cycles_leave_no_watcher_or_store_watch() {
    let _serial = SERIAL.lock().await;
    count_panics();
    let dir = tempfile::tempdir().expect("temp dir");
    let (store, node) = open(dir.path());
    // One registered worker, so that every delivery carries a member.
    let _reg = node.register_worker(spec(0)).await.expect("register");
    let baseline = (node.stats(), steady_watches(&store).await);
    assert_eq!(baseline.0.watchers, 0);
    // A watcher, and its first delivery (so it has read the membership and
    // armed its store watch): the number of members it saw.
    let watch = |node: &Node| {
        let (sender, mut deliveries) = mpsc::unbounded_channel::<usize>();
        let w = node
            .watch_membership(
                T.to_vec(),
                Box::new(move |m| {
                    let _ = sender.send(m.workers.len());
                }),
            )
            .expect("watch");
        async move {
            let first = tokio::time::timeout(Duration::from_secs(5), deliveries.recv())
                .await
                .expect("the first delivery within 5 s")
                .expect("a delivery");
            (w, first)
        }
    };
    for _ in 0..100 {
        let (w, first) = watch(&node).await;
        assert_eq!(first, 1);
        drop(w);
    }
    let start = settle(&node, &store, baseline).await;
    assert_eq!(start, baseline, "the warm-up left nothing behind");
    let rss_before = rss_bytes();
    let (cycles, secs) = budget();
    let t0 = Instant::now();
    let mut done = 0u64;
    let mut changes = 0u64;
    while done < cycles && t0.elapsed() < secs {
        let (w, first) = watch(&node).await;
        assert!(first >= 1, "the registered worker is seen");
        if done & 1 == 0 {
            w.stop();
        }
        drop(w);
        done += 1;
        if done % 1000 == 999 {
            // A membership change now and then, so that armed store watches
            // fire too (those of watchers not yet gone).
            changes += 1;
            let reg = node.register_worker(spec(1_000_000 + changes)).await.expect("register");
            node.unregister_worker(&reg).await.expect("unregister");
        }
    }
    let elapsed = t0.elapsed();
    let end = settle(&node, &store, start).await;
    let rss_after = rss_bytes();
    eprintln!(
        "membership watch start/stop: {done} cycles in {elapsed:.1?} ({:.0}/s), each waiting for its first delivery; \
         watcher tasks: start {}, end {}; pending store watches: start {}, end {}; \
         RSS {:.1} MB -> {:.1} MB ({:+.1} MB)",
        done as f64 / elapsed.as_secs_f64(),
        start.0.watchers,
        end.0.watchers,
        start.1,
        end.1,
        mb(rss_before),
        mb(rss_after),
        mb(rss_after) - mb(rss_before),
    );
    assert!(done >= 1_000, "too few cycles to say anything: {done}");
    assert_eq!(end, start, "watcher tasks and pending store watches back to their starting values");
    assert!(rss_after < rss_before + 100 * 1024 * 1024, "RSS grew by more than 100 MB");
    node.stop().await;
    assert_eq!(node.stats(), Stats { heartbeats: 0, watchers: 0, reapers: 0 });
    assert_eq!(store.pending_watches(), 0, "the store closed with no watch pending");
    assert_eq!(panics(), 0, "no panic in any background task");
}
