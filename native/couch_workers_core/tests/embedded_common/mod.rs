//! Helpers shared by the embedded store's own tests (`embedded_store.rs`,
//! `embedded_group_commit.rs`): a handle on a directory, and one write or
//! one read in a transaction of its own.

use std::sync::Arc;

use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::{run, Database, TxOptions};

/// A handle on the store in `dir` (made if need be), default options.
pub fn open(dir: &std::path::Path) -> Arc<EmbeddedStore> {
    EmbeddedStore::open(EmbeddedOptions::new(dir)).expect("open")
}

/// Writes `k` = `v` in a transaction of its own: its commit version.
pub async fn put(db: &EmbeddedStore, k: &[u8], v: &[u8]) -> u64 {
    let tx = db.create_transaction(&TxOptions::write()).await.expect("transaction");
    tx.set(k, v);
    tx.commit().await.expect("commit").version.expect("version")
}

/// Reads `k` in a read transaction of its own.
pub async fn get(db: &EmbeddedStore, k: &[u8]) -> Option<Vec<u8>> {
    run(db, TxOptions::read(), |tx| async move { tx.get(k, false).await }).await.expect("read")
}
