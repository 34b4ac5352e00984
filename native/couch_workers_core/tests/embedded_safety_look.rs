//! I1, an idle node: the embedded store's watcher thread, with a watch
//! pending and nothing committed, wakes only for its safety look, every
//! `safety_look` (default `SAFETY_LOOK`, 10 s; it was once a second). A
//! writer that sends no wake-up is still seen, within that bound.
//! One test per binary: it counts the context switches of the process's
//! `cw-embed-watch` threads (`/proc/self/task/*/status`, Linux).

use std::time::{Duration, Instant};

use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore, WakeCause, SAFETY_LOOK};
use couch_workers_core::store::{run, Database, TxOptions};

/// Voluntary and involuntary context switches of every thread named `name`.
fn switches(name: &str) -> u64 {
    let tasks = std::fs::read_dir("/proc/self/task").expect("/proc/self/task (Linux)");
    let mut total = 0;
    for task in tasks.flatten() {
        let p = task.path();
        if std::fs::read_to_string(p.join("comm")).unwrap_or_default().trim() != name {
            continue;
        }
        let status = std::fs::read_to_string(p.join("status")).unwrap_or_default();
        total += status
            .lines()
            .filter_map(|l| {
                l.strip_prefix("voluntary_ctxt_switches:").or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
            })
            .filter_map(|v| v.trim().parse::<u64>().ok())
            .sum::<u64>();
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_watcher_wakes_only_for_its_safety_look() {
    assert_eq!(SAFETY_LOOK, Duration::from_secs(10), "the documented default (docs/configuration and this test)");
    let dir = tempfile::tempdir().expect("temp dir");
    let db = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open");
    let w = run(&*db, TxOptions::read(), |tx| async move { Ok(tx.watch(b"k")) }).await.expect("watch");
    // Past the registration's look.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = switches("cw-embed-watch");
    tokio::time::sleep(Duration::from_secs(6)).await;
    let woke = switches("cw-embed-watch") - before;
    eprintln!("an idle watcher woke {woke} times in 6 s");
    // At most one safety look can fall in a 6 s window (plus a preemption
    // or two on a loaded machine); the 1 s look woke it 6 times or more.
    assert!(woke <= 3, "an idle watcher woke {woke} times in 6 s");

    // A bare SQLite writer (no wake-up sent) is seen by the next look:
    // within SAFETY_LOOK of its commit, plus room for a loaded machine.
    let raw = rusqlite::Connection::open(db.path()).expect("bare connection");
    raw.busy_timeout(Duration::from_secs(5)).expect("busy timeout");
    raw.execute("INSERT OR REPLACE INTO kv (key, value) VALUES (?1, ?2)", (b"k".as_slice(), b"raw".as_slice()))
        .expect("bare write");
    let written = Instant::now();
    match tokio::time::timeout(SAFETY_LOOK + Duration::from_secs(5), w).await {
        Ok(r) => r.expect("the watch fires"),
        Err(_) => {
            panic!("a commit that sent no wake-up was not seen within {:?}", SAFETY_LOOK + Duration::from_secs(5))
        }
    }
    let t = db.watch_trace().expect("a traced wake-up");
    eprintln!("bare write seen after {:?}: {t:?}", written.elapsed());
    assert_eq!(t.cause, WakeCause::Timer, "nothing woke the watcher but its safety look: {t:?}");
    drop(raw);
    db.close();
}
