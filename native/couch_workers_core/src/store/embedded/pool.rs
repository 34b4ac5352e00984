//! The pool of read connections of one store.
//!
//! Read-mode transactions each need a connection of their own (a WAL
//! reader keeps its snapshot for the length of its transaction, and never
//! blocks or is blocked by the writer). Idle ones are kept for reuse, up to
//! a few; more are opened when needed and closed when returned to a full
//! pool.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use rusqlite::Connection;

use super::{schema, EmbeddedOptions};
use crate::store::StoreError;

pub(crate) struct ReadPool {
    path: PathBuf,
    opts: EmbeddedOptions,
    idle: Mutex<Vec<Connection>>,
}

impl ReadPool {
    pub(crate) fn new(path: PathBuf, opts: EmbeddedOptions) -> Self {
        ReadPool { path, opts, idle: Mutex::new(Vec::new()) }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Connection>> {
        self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// An idle connection, or a new one.
    pub(crate) fn take(&self) -> Result<Connection, StoreError> {
        if let Some(conn) = self.lock().pop() {
            return Ok(conn);
        }
        schema::open_connection(&self.path, &self.opts)
    }

    /// Gives a connection back; it must be outside any transaction.
    pub(crate) fn put(&self, conn: Connection) {
        if !conn.is_autocommit() {
            return; // Could not be rolled back: do not reuse it.
        }
        // Opened while the file could not be opened for writing (SQLite then
        // falls back to a read-only descriptor: a read-only or immutable
        // file system): it would refuse every write for as long as it lives,
        // also after the fault has cleared. Drop it; the next one opened
        // once the fault is gone can write.
        if conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(true) {
            return;
        }
        let mut idle = self.lock();
        if idle.len() < self.opts.read_pool.max(1) {
            idle.push(conn);
        }
    }

    /// Closes every idle connection (the store is closing).
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }
}
