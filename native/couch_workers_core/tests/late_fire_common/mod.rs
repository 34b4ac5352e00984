//! Helpers shared by the tests of late fires of the embedded store's
//! watcher: handles whose safety look is an hour away, so that a change
//! seen only at the safety look is a clear failure, and a watch armed at a
//! known point of the watcher thread.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::{Database, TxOptions, Watch};

/// Generous for a watch that fires at all: the safety look is an hour away.
pub const FIRE_LIMIT: Duration = Duration::from_secs(5);

/// The options of a handle on `dir` whose safety look is an hour away.
pub fn hour_safety_look(dir: &std::path::Path) -> EmbeddedOptions {
    EmbeddedOptions { safety_look: Duration::from_secs(3600), ..EmbeddedOptions::new(dir) }
}

/// A watch of `key` on `db`, returned once the watcher thread has read
/// `key` since arming it (else that read could come after the change a
/// test makes next and fire the watch by chance): a second watch, fired
/// by the thread's read, is judged in such a read. `db`'s watches then
/// pend on `key` alone.
///
/// The second watch's key is written by a transaction that wrote it
/// before the watch was armed: a local commit fires the watches of a key
/// it changed itself only when they were armed before its first write of
/// the key, so this one is left to the thread.
pub async fn armed_watch(db: &dyn Database, key: &[u8]) -> Watch {
    let tx = db.create_transaction(&TxOptions::read()).await.expect("tx");
    let w = tx.watch(key);
    tx.commit().await.expect("arm the watch");
    // A new value each time, so that the helper can arm several watches
    // of one handle in turn (a write of the same value fires nothing).
    static SYNCS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let sync = SYNCS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    let write = db.create_transaction(&TxOptions::write()).await.expect("tx");
    write.set(b"sync", &sync.to_be_bytes());
    let tx = db.create_transaction(&TxOptions::read()).await.expect("tx");
    let synced = tx.watch(b"sync");
    tx.commit().await.expect("arm the second watch");
    write.commit().await.expect("plain write");
    tokio::time::timeout(FIRE_LIMIT, synced).await.expect("the watcher thread fires the watch").expect("fired");
    w
}

/// Makes `db`'s notification sources fail (testkit hook: no outside action
/// makes a bound socket's `recv` or an inotify read fail) and returns once
/// the watcher thread has taken the failure.
pub async fn fail_sources(db: &EmbeddedStore) {
    db.fail_watch_sources();
    let failed = Instant::now();
    while db.watch_sources_failure_pending() {
        assert!(failed.elapsed() < FIRE_LIMIT, "the watcher thread never took the sources' failure");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
