//! A handle whose notification sources failed (its wake socket's file or
//! the `wake/` directory removed, a failing read) polls at once, and then
//! listens again: a new socket in `wake/` (the directory made again), so
//! that other handles' commits wake it and, once the grace after it is
//! over (2 s of polling while the others learn of the new socket), an
//! idle node stops polling (it once polled `data_version` every few
//! milliseconds until it closed).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use couch_workers_core::store::embedded::{EmbeddedStore, WakeCause};
use couch_workers_core::store::{Database, TxOptions};

mod late_fire_common;
use late_fire_common::{armed_watch, fail_sources, hour_safety_look, FIRE_LIMIT};

/// The first attempt to listen again comes 1 s after the failure
/// (`relisten.rs`'s `RELISTEN_FIRST`); this leaves room for a loaded host.
const LISTENS_AGAIN_WITHIN: Duration = Duration::from_secs(5);
/// The watcher polls for 2 s after it listens again (`RELISTEN_GRACE`).
const GRACE: Duration = Duration::from_secs(2);

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

/// Waits until `db`'s watcher has taken the failure of its sources (its
/// thread reads the event on its own time), then until it listens again.
async fn listening_again(db: &EmbeddedStore, what: &str) {
    let started = Instant::now();
    while db.wake_stats().listening {
        assert!(started.elapsed() < LISTENS_AGAIN_WITHIN, "{what}: its watcher never took the failure");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
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
/// wake-up of its new socket, not through polling (over once the grace
/// is) or the safety look.
async fn woken_by_the_other_handle(writer: &EmbeddedStore, watcher: &EmbeddedStore, key: &[u8]) {
    wake_ups_reach(writer, watcher).await;
    tokio::time::sleep(GRACE).await;
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
    // The writer's own socket went with the directory too: it listens
    // again as well (maybe already, maybe still to come).
    let started = Instant::now();
    while !(writer.wake_stats().listening && socket_files(dir.path()).len() == 2) {
        assert!(
            started.elapsed() < LISTENS_AGAIN_WITHIN,
            "not one new socket per handle in the new directory: {:?}, writer {:?}",
            socket_files(dir.path()),
            writer.wake_stats()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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
