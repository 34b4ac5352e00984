//! When the watcher thread's notification sources fail while it waits (a
//! failing `recv` of its wake socket or read of inotify: `listener.rs` then
//! drops them and the thread polls `data_version`), the wait it is in no
//! longer keeps the deadline it planned with notifications (the safety
//! look, an hour here): the first commit of another handle after the
//! failure, whose wake-up nobody reads any more, is seen by polling,
//! within a few milliseconds.
//!
//! The failure comes from the store's test hook
//! (`EmbeddedStore::fail_watch_sources`): no outside action makes a bound
//! datagram socket's `recv` or an inotify read fail.

use std::sync::Arc;
use std::time::{Duration, Instant};

use couch_workers_core::store::embedded::EmbeddedStore;
use couch_workers_core::store::{Database, TxOptions, Watch};

mod late_fire_common;
use late_fire_common::{armed_watch, fail_sources, hour_safety_look, FIRE_LIMIT};

/// Polling looks every `watch_poll_idle` (4 ms by default); this leaves
/// room for a loaded host.
const POLLED_WITHIN: Duration = Duration::from_secs(1);

/// Two handles on `dir` whose safety look is an hour away: the writer and
/// the watcher.
fn two_handles(dir: &std::path::Path) -> (Arc<EmbeddedStore>, Arc<EmbeddedStore>) {
    let writer = EmbeddedStore::open(hour_safety_look(dir)).expect("open the writing handle");
    let watcher = EmbeddedStore::open(hour_safety_look(dir)).expect("open the watching handle");
    (writer, watcher)
}

/// Commits `k` on `writer` and asserts that `w`, another handle's watch
/// of it, fires within `POLLED_WITHIN` (by polling, `since` the
/// notifications ended), not at the safety look.
async fn fires_by_polling(writer: &dyn Database, w: Watch, since: &str) {
    let tx = writer.create_transaction(&TxOptions::write()).await.expect("tx");
    tx.set(b"k", b"v");
    tx.commit().await.expect("the other handle's write");
    let committed = Instant::now();
    tokio::time::timeout(FIRE_LIMIT, w)
        .await
        .unwrap_or_else(|_| panic!("the watch fires by polling once {since}, not at the safety look"))
        .expect("fired");
    let late = committed.elapsed();
    eprintln!("fired {late:?} after the other handle's commit ({since})");
    assert!(late <= POLLED_WITHIN, "fired {late:?} after the commit");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_change_after_the_sources_failed_is_seen_by_polling_not_at_the_safety_look() {
    let dir = tempfile::tempdir().expect("dir");
    let (writer, watcher) = two_handles(dir.path());
    // Armed once the watcher thread has read `k` since (`armed_watch`).
    let w = armed_watch(&*watcher, b"k").await;

    fail_sources(&watcher).await;

    fires_by_polling(&*writer, w, "the sources failed").await;
    watcher.close();
    writer.close();
}

/// The outside action: the store directory's `wake/` (this handle's
/// socket file, and the inotify watch on the directory) removed while the
/// handle is open. Other handles can no longer find this one's socket,
/// so their commits wake it no more: it must poll from then on.
#[tokio::test(flavor = "multi_thread")]
async fn a_change_after_the_wake_directory_was_removed_is_seen_by_polling() {
    let dir = tempfile::tempdir().expect("dir");
    let (writer, watcher) = two_handles(dir.path());
    // Armed once the watcher thread has read `k` since (`armed_watch`).
    let w = armed_watch(&*watcher, b"k").await;

    std::fs::remove_dir_all(dir.path().join("wake")).expect("remove the wake directory");

    fires_by_polling(&*writer, w, "the wake directory is gone").await;
    watcher.close();
    writer.close();
}
