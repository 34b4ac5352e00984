//! Versions of the embedded store's transactions.
//!
//! The read version is fixed when the transaction starts:
//! `max(last_version in its snapshot, clock)`, the clock read first. The
//! commit version is fixed under the write lock when first needed (the
//! first versionstamped operation, else the commit) as
//! `max(last_version + 1, clock + 1)` and stored as `last_version` in the
//! same SQLite transaction, so commit versions strictly increase across
//! every process (on the write connection the group commit keeps
//! `last_version` in memory while SQLite's write lock is held, and stores
//! the highest version of the batch right before its `COMMIT`). As in FDB,
//! a commit's version exceeds the read version of every transaction that
//! started after it committed. Unlike FDB, a
//! transaction that started while another was committing may get a read
//! version above that commit's version without seeing it (the window is
//! from the version being fixed to COMMIT: microseconds, or the rest of the
//! transaction after a versionstamped operation). Anything it then writes
//! conflicts (read mode) or waits for the lock (write mode), so this only
//! matters to read-only decisions.

use rusqlite::Connection;

use super::EmbeddedTransaction;
use crate::store::embedded::schema;
use crate::store::StoreError;

/// What a writing transaction knows about its commit.
#[derive(Default)]
pub(super) struct CommitState {
    /// The commit version, fixed (and stored as `last_version`) when first
    /// needed: by a versionstamped operation or at commit.
    pub(super) version: Option<u64>,
    /// A versionstamped operation was used.
    pub(super) stamped: bool,
    /// Runs on the write connection: the last version is kept by the
    /// group commit (`group.rs`) instead of being read and written in
    /// `meta` by every transaction.
    pub(super) on_writer: bool,
}

/// The read version of a transaction whose snapshot holds `last` as the
/// last commit version, the clock read as `clock_now` before the snapshot.
pub(super) fn read_version(last: u64, clock_now: u64) -> u64 {
    last.max(clock_now)
}

impl EmbeddedTransaction {
    /// The commit version: fixed under the write lock when first needed.
    pub(super) fn version(&self, conn: &Connection, commit: &mut CommitState) -> Result<u64, StoreError> {
        if let Some(v) = commit.version {
            return Ok(v);
        }
        let group = &self.shared.group;
        let fix = || -> rusqlite::Result<u64> {
            let cached = if commit.on_writer { group.last_version() } else { None };
            let last = match cached {
                Some(last) => last,
                None => schema::last_version(conn)?,
            };
            let v = last.saturating_add(1).max(self.shared.clock.now().saturating_add(1));
            if commit.on_writer {
                // Stored in `meta` by the batch's commit (`group.rs`).
                group.fixed(v);
            } else {
                schema::set_last_version(conn, v)?;
            }
            Ok(v)
        };
        let v = fix().map_err(|e| schema::store_error("cannot fix the commit version", &e))?;
        commit.version = Some(v);
        Ok(v)
    }
}
