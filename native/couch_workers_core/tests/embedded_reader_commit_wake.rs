//! A commit of a read-mode transaction that wrote (SQLite upgraded it to a
//! writer on its pooled read connection) wakes the store's other handles,
//! as every commit of this code must (`wake.rs`): their watches of what it
//! wrote fire at once, not at the next safety look. Until session 11 only
//! the write connection's commits sent wake-ups (its WAL hook), so such a
//! commit was seen by other handles only at their safety look (10 s by
//! default; an hour here).

use std::time::Duration;

use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::{Database, TxOptions};

/// Generous: a watch that fires at all fires within this; the safety look
/// is an hour away.
const FIRE_LIMIT: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread")]
async fn a_read_mode_commit_that_wrote_wakes_the_other_handles() {
    let dir = tempfile::tempdir().expect("dir");
    let opts =
        |dir: &std::path::Path| EmbeddedOptions { safety_look: Duration::from_secs(3600), ..EmbeddedOptions::new(dir) };
    let writer = EmbeddedStore::open(opts(dir.path())).expect("open the writing handle");
    let watcher = EmbeddedStore::open(opts(dir.path())).expect("open the watching handle");
    let tx = watcher.create_transaction(&TxOptions::read()).await.expect("tx");
    let w = tx.watch(b"k");
    tx.commit().await.expect("arm the watch");
    // A point after which the watcher thread has read `k` since arming
    // `w` (else that read could come after the write below and fire `w`
    // by chance): a second watch, fired by a plain local write, is judged
    // in such a read.
    let tx = watcher.create_transaction(&TxOptions::read()).await.expect("tx");
    let synced = tx.watch(b"sync");
    tx.commit().await.expect("arm the second watch");
    let tx = watcher.create_transaction(&TxOptions::write()).await.expect("tx");
    tx.set(b"sync", b"1");
    tx.commit().await.expect("plain write");
    tokio::time::timeout(FIRE_LIMIT, synced).await.expect("a local write fires its watch").expect("fired");
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
