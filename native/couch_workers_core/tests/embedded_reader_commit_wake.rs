//! A commit of a read-mode transaction that wrote (SQLite upgraded it to a
//! writer on its pooled read connection) wakes the store's other handles,
//! as every commit of this code must (`wake.rs`): their watches of what it
//! wrote fire at once, not at the next safety look. Once only
//! the write connection's commits sent wake-ups (its WAL hook), so such a
//! commit was seen by other handles only at their safety look (10 s by
//! default; an hour here).

use couch_workers_core::store::embedded::EmbeddedStore;
use couch_workers_core::store::{Database, TxOptions};

mod late_fire_common;
use late_fire_common::{armed_watch, hour_safety_look, FIRE_LIMIT};

#[tokio::test(flavor = "multi_thread")]
async fn a_read_mode_commit_that_wrote_wakes_the_other_handles() {
    let dir = tempfile::tempdir().expect("dir");
    let opts = hour_safety_look;
    let writer = EmbeddedStore::open(opts(dir.path())).expect("open the writing handle");
    let watcher = EmbeddedStore::open(opts(dir.path())).expect("open the watching handle");
    // Armed once the watcher thread has read `k` since (`armed_watch`).
    let w = armed_watch(&*watcher, b"k").await;
    assert_eq!(watcher.pending_watches(), 1);

    let tx = writer.create_transaction(&TxOptions::read()).await.expect("read-mode tx");
    tx.set(b"k", b"v");
    tx.commit().await.expect("the read-mode transaction's write commits");

    tokio::time::timeout(FIRE_LIMIT, w)
        .await
        .expect("the other handle's watch fires without waiting for its safety look")
        .expect("fired");
    assert!(writer.wake_stats().sent >= 1, "the read-mode commit sent a wake-up: {:?}", writer.wake_stats());
    watcher.close();
    writer.close();
}
