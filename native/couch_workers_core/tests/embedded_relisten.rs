//! A handle whose notification sources failed (its wake socket's file or
//! the `wake/` directory removed, a failing read) polls at once, and then
//! listens again: a new socket in `wake/` (the directory made again), so
//! that other handles' commits wake it and an idle node stops polling.
//! Until session 13 it polled `data_version` every few milliseconds until
//! it closed.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use couch_workers_core::store::embedded::{EmbeddedStore, WakeCause};
use couch_workers_core::store::{Database, TxOptions};

mod late_fire_common;
use late_fire_common::{armed_watch, fail_sources, hour_safety_look, FIRE_LIMIT};

/// The first attempt to listen again comes 1 s after the failure
/// (`wait.rs`'s `RELISTEN_FIRST`); this leaves room for a loaded host.
const LISTENS_AGAIN_WITHIN: Duration = Duration::from_secs(5);

fn open(dir: &Path) -> Arc<EmbeddedStore> {
    EmbeddedStore::open(hour_safety_look(dir)).expect("open a handle")
}

fn socket_files(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir.join("wake"))
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".sock"))
                .collect()
        })
        .unwrap_or_default()
}

async fn set(db: &dyn Database, key: &[u8], value: &[u8]) {
    let tx = db.create_transaction(&TxOptions::write()).await.expect("tx");
    tx.set(key, value);
    tx.commit().await.expect("commit");
}

/// Waits until `db` listens to its notifications again.
async fn listening_again(db: &EmbeddedStore, what: &str) {
    let started = Instant::now();
    while !db.wake_stats().listening {
        assert!(
            started.elapsed() < LISTENS_AGAIN_WITHIN,
            "{what}: still not listening {:?} after its notifications failed: {:?}",
            started.elapsed(),
            db.wake_stats()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Commits on `writer` until one of them wakes `watcher` through its new
/// socket: `writer` learns of the socket when its watcher thread reads the
/// directory's inotify event (at once if it sent to the failed socket
/// since), which a loaded host may delay a moment.
async fn wake_ups_reach(writer: &EmbeddedStore, watcher: &EmbeddedStore) {
    let started = Instant::now();
    let received = watcher.wake_stats().received;
    for i in 0u64.. {
        set(writer, b"probe", &i.to_be_bytes()).await;
        if watcher.wake_stats().received > received {
            return;
        }
        assert!(
            started.elapsed() < LISTENS_AGAIN_WITHIN,
            "no wake-up reached the new socket in {:?}: {:?} / {:?}",
            started.elapsed(),
            writer.wake_stats(),
            watcher.wake_stats()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `watcher`'s next watch of `key` fires on `writer`'s commit through a
/// wake-up of its new socket, not through polling or the safety look.
async fn woken_by_the_other_handle(writer: &EmbeddedStore, watcher: &EmbeddedStore, key: &[u8]) {
    wake_ups_reach(writer, watcher).await;
    let w = armed_watch(watcher, key).await;
    let received = watcher.wake_stats().received;
    set(writer, key, b"after").await;
    tokio::time::timeout(FIRE_LIMIT, w).await.expect("the watch fires").expect("fired");
    let trace = watcher.watch_trace().expect("a traced look");
    assert_eq!(trace.cause, WakeCause::Peer, "woken by the other handle's wake-up: {trace:?}");
    assert!(watcher.wake_stats().received > received, "{:?}", watcher.wake_stats());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handle_whose_wake_directory_was_removed_listens_again() {
    let dir = tempfile::tempdir().expect("dir");
    let writer = open(dir.path());
    let watcher = open(dir.path());
    assert!(watcher.wake_stats().listening, "{:?}", watcher.wake_stats());
    let w = armed_watch(&*watcher, b"k").await;

    std::fs::remove_dir_all(dir.path().join("wake")).expect("remove the wake directory");
    // Polling at once: the change is seen long before the safety look.
    set(&*writer, b"k", b"v").await;
    tokio::time::timeout(FIRE_LIMIT, w).await.expect("seen by polling").expect("fired");

    listening_again(&watcher, "the watching handle").await;
    listening_again(&writer, "the writing handle").await;
    assert_eq!(socket_files(dir.path()).len(), 2, "one new socket per handle in the new directory");
    woken_by_the_other_handle(&writer, &watcher, b"k2").await;
    watcher.close();
    writer.close();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_source_lets_its_socket_go_and_a_new_one_is_bound() {
    let dir = tempfile::tempdir().expect("dir");
    let writer = open(dir.path());
    let watcher = open(dir.path());
    let before = socket_files(dir.path());
    assert_eq!(before.len(), 2, "{before:?}");
    // Armed once the watcher thread has read `k` since (`armed_watch`).
    let w = armed_watch(&*watcher, b"k").await;

    fail_sources(&watcher).await;
    set(&*writer, b"k", b"v").await;
    tokio::time::timeout(FIRE_LIMIT, w).await.expect("seen by polling").expect("fired");

    listening_again(&watcher, "the watching handle").await;
    let after = socket_files(dir.path());
    assert_eq!(after.len(), 2, "the failed socket's file went, a new one came: {before:?} then {after:?}");
    assert_eq!(before.intersection(&after).count(), 1, "only the writer's is the same: {before:?} then {after:?}");
    woken_by_the_other_handle(&writer, &watcher, b"k2").await;
    watcher.close();
    writer.close();
    assert!(socket_files(dir.path()).is_empty(), "closed handles leave no socket file");
}
