//! Helpers shared by the tests of late fires of the embedded store's
//! watcher: handles whose safety look is an hour away, so that a change
//! seen only at the safety look is a clear failure, and a watch armed at a
//! known point of the watcher thread.

#![allow(dead_code)]

use std::time::Duration;

use couch_workers_core::store::embedded::EmbeddedOptions;
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
/// by a plain local write, is judged in such a read. `db`'s watches then
/// pend on `key` alone.
pub async fn armed_watch(db: &dyn Database, key: &[u8]) -> Watch {
    let tx = db.create_transaction(&TxOptions::read()).await.expect("tx");
    let w = tx.watch(key);
    tx.commit().await.expect("arm the watch");
    let tx = db.create_transaction(&TxOptions::read()).await.expect("tx");
    let synced = tx.watch(b"sync");
    tx.commit().await.expect("arm the second watch");
    let tx = db.create_transaction(&TxOptions::write()).await.expect("tx");
    tx.set(b"sync", b"1");
    tx.commit().await.expect("plain write");
    tokio::time::timeout(FIRE_LIMIT, synced).await.expect("a local write fires its watch").expect("fired");
    w
}
