//! Post-commit wake-ups between processes (`store/embedded/wake.rs`,
//! `notify.rs`): a commit in another OS process wakes a watch here once it
//! is visible, found by one look at `data_version` (no settle window); a
//! writer that sends nothing is still seen by the safety look; the socket
//! file of a `kill -9`ed process is removed by the next sender; a
//! directory that refuses the socket leaves the store working on its WAL
//! fallback, with a log event.
//!
//! The child processes re-execute this test binary (`current_exe --exact
//! <test>`) with `CW_WAKE_ROLE` set: the same test function then plays
//! the child's part.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use couch_workers_core::log::{Event, Sink};
use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore, WakeCause};
use couch_workers_core::store::{run, Database, TxOptions};

mod child_common;

const ROLE: &str = "CW_WAKE_ROLE";
const DIR: &str = "CW_WAKE_DIR";
const VALUE: &str = "CW_WAKE_VALUE";

/// Generous: a watch that fires at all fires within this (the safety look
/// is 1 s; the machine may be loaded).
const FIRE_LIMIT: Duration = Duration::from_secs(5);

fn spawn_child(test: &str, role: &str, dir: &Path, value: u64) -> Child {
    let value = value.to_string();
    child_common::spawn(test, &[(ROLE, role.as_ref()), (DIR, dir.as_os_str()), (VALUE, value.as_ref())])
}

fn wait_child(child: Child, what: &str) {
    child_common::wait(child, what);
}

fn child_env() -> Option<(String, PathBuf, u64)> {
    let role = std::env::var(ROLE).ok()?;
    let dir = PathBuf::from(std::env::var(DIR).expect("child dir"));
    let value = std::env::var(VALUE).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    Some((role, dir, value))
}

async fn set(db: &EmbeddedStore, key: &[u8], value: &[u8]) {
    let tx = db.create_transaction(&TxOptions::write()).await.expect("tx");
    tx.set(key, value);
    tx.commit().await.expect("commit");
}

fn sockets(dir: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(dir.join("wake")) {
        Ok(entries) => entries.flatten().map(|e| e.path()).collect(),
        Err(_) => Vec::new(),
    }
}

/// The child's part: open the store, write `k` = value once, close.
async fn write_once(dir: &Path, value: u64) {
    let db = EmbeddedStore::open(EmbeddedOptions::new(dir)).expect("child open");
    set(&db, b"k", &value.to_be_bytes()).await;
    let stats = db.wake_stats();
    assert!(stats.sent >= 1, "the child's commit woke the parent's handle: {stats:?}");
    db.close();
}

/// Ten changes, each written by a new child process: each watch fires,
/// and where the child's wake-up is what woke the watcher (not the safety
/// look, which may beat it now and then on a loaded machine) one look at
/// `data_version` found the commit: no settle window. With inotify on the
/// WAL the first look came 50 µs after the frames were written, before
/// the commit was visible, and usually found nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_in_another_process_wakes_a_watch_with_one_look() {
    const TEST: &str = "a_commit_in_another_process_wakes_a_watch_with_one_look";
    if let Some((_, dir, value)) = child_env() {
        write_once(&dir, value).await;
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let db = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open");
    assert!(db.wake_stats().listening, "the wake socket is bound: {:?}", db.wake_stats());
    let changes = 10;
    let mut by_peer = 0;
    for i in 1..=changes {
        let w = run(&*db, TxOptions::read(), |tx| async move { Ok(tx.watch(b"k")) }).await.expect("watch");
        let child = spawn_child(TEST, "writer", dir.path(), i);
        match tokio::time::timeout(FIRE_LIMIT, w).await {
            Ok(r) => r.expect("the watch fires"),
            Err(_) => panic!("change {i}, written by another process, did not fire its watch within {FIRE_LIMIT:?}"),
        }
        wait_child(child, "the writing child");
        let t = db.watch_trace().expect("a traced wake-up");
        eprintln!("change {i}: cause {:?}, looks {}", t.cause, t.looks);
        if t.cause == WakeCause::Peer {
            by_peer += 1;
            assert!(t.peer_wake.is_some(), "{t:?}");
            assert_eq!(t.looks, 1, "change {i}: the post-commit wake-up's first look finds the commit: {t:?}");
        } else {
            // The safety look, or the watch's registration look, came
            // first (the watcher thread waited for a CPU).
            assert!(matches!(t.cause, WakeCause::Timer | WakeCause::Local), "change {i}: {t:?}");
        }
    }
    let stats = db.wake_stats();
    assert!(stats.received >= by_peer, "{stats:?}");
    assert!(by_peer * 2 >= changes, "most changes were seen through the wake-up ({by_peer} of {changes})");
    db.close();
    assert!(sockets(dir.path()).is_empty(), "close removes the socket: {:?}", sockets(dir.path()));
}

/// A writer that sends no wake-up (here a bare SQLite connection, as the
/// `sqlite3` shell would be): the watcher's safety look still sees its
/// commit, within the store's `safety_look` (1 s here; the default is
/// 10 s, `tests/embedded_safety_look.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_sends_nothing_is_seen_by_the_safety_look() {
    let dir = tempfile::tempdir().expect("temp dir");
    let opts = EmbeddedOptions { safety_look: Duration::from_secs(1), ..EmbeddedOptions::new(dir.path()) };
    let db = EmbeddedStore::open(opts).expect("open");
    let w = run(&*db, TxOptions::read(), |tx| async move { Ok(tx.watch(b"k")) }).await.expect("watch");
    // Past the watch's registration look.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let raw = rusqlite::Connection::open(db.path()).expect("bare connection");
    raw.busy_timeout(Duration::from_secs(5)).expect("busy timeout");
    raw.execute("INSERT OR REPLACE INTO kv (key, value) VALUES (?1, ?2)", (b"k".as_slice(), b"raw".as_slice()))
        .expect("bare write");
    let written = Instant::now();
    match tokio::time::timeout(FIRE_LIMIT, w).await {
        Ok(r) => r.expect("the watch fires"),
        Err(_) => panic!("a commit that sent no wake-up was not seen within {FIRE_LIMIT:?}"),
    }
    let t = db.watch_trace().expect("a traced wake-up");
    eprintln!("bare write seen after {:?}: {t:?}", written.elapsed());
    assert_eq!(t.cause, WakeCause::Timer, "nothing woke the watcher but its safety look: {t:?}");
    assert_eq!(db.wake_stats().received, 0);
    drop(raw);
    db.close();
}

/// The child's part: open the store, say so, wait to be killed.
async fn open_and_wait(dir: &Path) {
    let _db = EmbeddedStore::open(EmbeddedOptions::new(dir)).expect("child open");
    println!("opened");
    tokio::time::sleep(Duration::from_secs(60)).await;
    panic!("the child was not killed within 60 s");
}

async fn spawn_and_kill(test: &str, dir: &Path) -> PathBuf {
    let before = sockets(dir);
    let mut child = spawn_child(test, "victim", dir, 0);
    let started = Instant::now();
    let socket = loop {
        if let Some(s) = sockets(dir).into_iter().find(|s| !before.contains(s)) {
            break s;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "the child's socket did not appear");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    child.kill().expect("kill -9 the child");
    child.wait().expect("reap the child");
    assert!(socket.exists(), "a killed process leaves its socket's file");
    socket
}

/// A `kill -9`ed process leaves its socket's file: a handle that was
/// sending to it removes it at its next commit, and a handle opened after
/// the kill removes another at its first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socket_of_a_killed_process_is_removed() {
    const TEST: &str = "the_socket_of_a_killed_process_is_removed";
    if let Some((_, dir, _)) = child_env() {
        open_and_wait(&dir).await;
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let sender = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open");
    let victim = spawn_and_kill(TEST, dir.path()).await;
    set(&sender, b"a", b"1").await;
    assert!(!victim.exists(), "the sender's commit removed the dead socket");
    assert_eq!(sender.wake_stats().cleaned, 1, "{:?}", sender.wake_stats());
    sender.close();

    let victim = spawn_and_kill(TEST, dir.path()).await;
    let late = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open after the kill");
    set(&late, b"a", b"2").await;
    assert!(!victim.exists(), "the first commit of a handle opened later removed it");
    assert_eq!(late.wake_stats().cleaned, 1, "{:?}", late.wake_stats());
    late.close();
    assert!(sockets(dir.path()).is_empty(), "nothing left: {:?}", sockets(dir.path()));
}

#[derive(Default)]
struct Collect(Mutex<Vec<Event>>);

impl Sink for Collect {
    fn log(&self, event: Event) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(event);
    }
}

/// `wake` in the store directory cannot hold sockets (here it is a file;
/// as on a full or read-only file system the bind fails): the store opens
/// anyway, says so in the log, and its watches fire through the WAL
/// fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_that_refuses_the_socket_falls_back() {
    let sink = Arc::new(Collect::default());
    couch_workers_core::log::set_process_sink(Some(sink.clone()));
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("wake"), b"not a directory").expect("a file named wake");
    let a = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("the store opens without its socket");
    let b = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open b");
    couch_workers_core::log::set_process_sink(None);
    assert!(!a.wake_stats().listening, "{:?}", a.wake_stats());
    let logged =
        sink.0.lock().unwrap_or_else(|p| p.into_inner()).iter().filter(|e| e.what == "wake_socket_unavailable").count();
    assert_eq!(logged, 2, "each handle logged why it has no socket");
    for i in 0u32..20 {
        let w = run(&*a, TxOptions::read(), |tx| async move { Ok(tx.watch(b"k")) }).await.expect("watch");
        set(&b, b"k", &i.to_be_bytes()).await;
        match tokio::time::timeout(FIRE_LIMIT, w).await {
            Ok(r) => r.expect("the watch fires"),
            Err(_) => panic!("change {i} did not fire its watch on the fallback"),
        }
    }
    let t = a.watch_trace().expect("a traced wake-up");
    assert!(t.wal_event.is_some(), "the WAL fallback ran: {t:?}");
    a.close();
    b.close();
}
