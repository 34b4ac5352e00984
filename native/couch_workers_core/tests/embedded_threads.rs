//! The embedded store's background thread that waits for other handles'
//! wake-ups (the watcher: it polls the wake socket
//! itself, and no `cw-embed-notify` thread runs beside it) stops with its
//! store, and its wake socket's file goes with it: live counts that return
//! to zero. Alone in its test binary, so that no other test's stores are
//! counted.

use std::time::{Duration, Instant};

use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::Db;

/// Threads of this process named like the store's watcher.
fn watcher_threads() -> usize {
    threads_named("cw-embed-watch")
}

/// Threads of this process named `name`.
fn threads_named(name: &str) -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    tasks
        .filter_map(|t| t.ok())
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .filter(|comm| comm.trim() == name)
        .count()
}

/// Wake sockets in the store directory `dir`.
fn sockets(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir.join("wake")).map(|d| d.count()).unwrap_or(0)
}

fn wait_for(dir: &std::path::Path, count: usize) {
    let started = Instant::now();
    while watcher_threads() != count || sockets(dir) != count {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "expected {count} watcher threads and {count} sockets, have {} and {}",
            watcher_threads(),
            sockets(dir)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The threads whose names start `cw-embed` (the store's background
/// threads: `cw-embed-watch`, `cw-embed-ckpt`).
fn store_threads() -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    let mut names: Vec<String> = tasks
        .filter_map(|t| t.ok())
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|comm| comm.trim().to_string())
        .filter(|comm| comm.starts_with("cw-embed"))
        .collect();
    names.sort();
    names
}

/// Waits (2 s at most) until the store threads are `expected`. A new
/// thread carries its creator's name until it first runs and names itself
/// (std names a thread from inside it), so one read straight after `open`
/// can miss a checkpointer that has not been scheduled yet: that flaked
/// on a loaded CI host.
fn wait_for_store_threads(expected: &[String]) {
    let started = Instant::now();
    loop {
        let names = store_threads();
        if names == expected {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "no cw-embed-notify thread: expected {expected:?}, have {names:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn watcher_threads_stop_with_their_store() {
    if !std::path::Path::new("/proc/self/task").exists() {
        panic!("this test reads /proc/self/task (Linux)");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    assert_eq!(watcher_threads(), 0);
    let a: Db = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open");
    let b: Db = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open");
    let c: Db = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open");
    wait_for(dir.path(), 3);
    // Two threads per store, the watcher and the checkpointer: the
    // watcher receives the wake-ups itself (there were three, with
    // `cw-embed-notify`).
    let mut expected = vec!["cw-embed-ckpt".to_string(); 3];
    expected.extend(vec!["cw-embed-watch".to_string(); 3]);
    wait_for_store_threads(&expected);
    a.close();
    wait_for(dir.path(), 2);
    a.close();
    drop(a);
    drop(b);
    wait_for(dir.path(), 1);
    // A transaction keeps the store's shared state, not its thread.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let tx = c.create_transaction(&couch_workers_core::store::TxOptions::write()).await.expect("tx");
        drop(c);
        wait_for(dir.path(), 0);
        tx.set(b"k", b"v");
        tx.commit().await.expect("commit after the last handle is gone");
    });
    wait_for(dir.path(), 0);
}
