//! The write operations of an embedded transaction: size checks, the
//! upgrade of a read-mode transaction to a writer, versionstamps, and the
//! atomic adds a writer holds until needed (`adds.rs`).

use rusqlite::Connection;

use super::version::CommitState;
use super::{EmbeddedTransaction, TxState};
use crate::store::embedded::adds::may_be_stamped;
use crate::store::embedded::schema::{self, SQL_ADD, SQL_SET};
use crate::store::embedded::watch::Written;
use crate::store::mutation as ops;
use crate::store::{StoreError, MAX_KEY_SIZE, MAX_TRANSACTION_SIZE, MAX_VALUE_SIZE};

impl EmbeddedTransaction {
    /// Writes the held adds to the keys the next operation touches, so
    /// that it sees them (and a write or clear of the key comes after
    /// them). A failure fails the transaction.
    pub(super) fn flush_adds(&self, touched: impl Fn(&[u8]) -> bool) {
        let mut st = self.lock();
        if st.adds.is_empty() {
            return;
        }
        let due = st.adds.take(touched);
        if due.is_empty() || self.usable(&mut st).is_err() {
            return;
        }
        let applied =
            st.slot.conn().and_then(|conn| due.iter().try_for_each(|(key, delta)| Self::add(conn, key, *delta)));
        if let Err(e) = applied {
            self.fail(&mut st, e);
        }
    }

    /// Before a write of `key`: if a watch of this store waits on it and
    /// this transaction has not touched it yet, keeps its value now (the
    /// last any other commit left: a writer holds SQLite's write lock, and
    /// a reader's first write fails unless its snapshot is the latest), so
    /// that the commit fires the watches that expect it (`watch.rs`). A
    /// key this transaction already touched (written, cleared in a range,
    /// or added to) is left to the watcher thread: its value now is not
    /// the one before the commit.
    pub(super) fn note_first_write(&self, key: &[u8]) {
        if !self.shared.watches.is_watched(key) {
            return;
        }
        let mut st = self.lock();
        if self.usable(&mut st).is_err() || st.first_writes.iter().any(|(k, _)| k == key) || st.touched(key) {
            return;
        }
        let before = st.slot.conn().and_then(|conn| {
            schema::get_value(conn, key).map_err(|e| schema::store_error("cannot read a watched key", &e))
        });
        match before {
            Ok(before) => st.first_writes.push((key.to_vec(), before)),
            Err(e) => self.fail(&mut st, e),
        }
    }

    /// Runs one write: checks, counts `bytes` against the transaction size
    /// limit, takes SQLite's write lock in read mode, then `f`.
    pub(super) fn write(
        &self,
        bytes: usize,
        f: impl FnOnce(&Connection, &mut CommitState) -> Result<Written, StoreError>,
    ) {
        let mut st = self.lock();
        if self.usable(&mut st).is_err() {
            return;
        }
        let result = self.write_locked(&mut st, bytes, f);
        match result {
            Ok(written) => {
                st.wrote = true;
                st.written.push(written);
            }
            Err(e) => self.fail(&mut st, e),
        }
    }

    fn write_locked(
        &self,
        st: &mut TxState,
        bytes: usize,
        f: impl FnOnce(&Connection, &mut CommitState) -> Result<Written, StoreError>,
    ) -> Result<Written, StoreError> {
        st.written_bytes = st.written_bytes.saturating_add(bytes);
        if st.written_bytes > MAX_TRANSACTION_SIZE {
            return Err(StoreError::TransactionTooLarge);
        }
        let conn = st.slot.conn()?;
        if !st.locked {
            // Read mode: this write upgrades the SQLite transaction, which
            // fails when another connection writes or has committed since
            // this transaction's snapshot.
            match conn.execute(schema::SQL_TAKE_WRITE_LOCK, []) {
                Ok(_) => st.locked = true,
                Err(e) if schema::is_busy(&e) => return Err(StoreError::Conflict),
                Err(e) => return Err(schema::store_error("cannot write", &e)),
            }
        }
        f(conn, &mut st.commit)
    }

    pub(super) fn put(conn: &Connection, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        conn.prepare_cached(SQL_SET)
            .and_then(|mut s| s.execute(rusqlite::params![key, value]))
            .map(|_| ())
            .map_err(|e| schema::store_error("cannot write", &e))
    }

    /// FoundationDB's ADD of `delta` to `key`, in one statement.
    pub(super) fn add(conn: &Connection, key: &[u8], delta: i64) -> Result<(), StoreError> {
        conn.prepare_cached(SQL_ADD)
            .and_then(|mut s| s.execute(rusqlite::params![key, delta]))
            .map(|_| ())
            .map_err(|e| schema::store_error("cannot apply atomic_add", &e))
    }

    pub(super) fn check_sizes(key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        if key.len() > MAX_KEY_SIZE {
            return Err(StoreError::KeyTooLarge);
        }
        if value.len() > MAX_VALUE_SIZE {
            return Err(StoreError::ValueTooLarge);
        }
        Ok(())
    }

    pub(super) fn byte_max(&self, key: &[u8], value: &[u8]) {
        self.note_first_write(key);
        self.flush_adds(|k| k == key);
        self.write(key.len() + value.len(), |conn, _| {
            Self::check_sizes(key, value)?;
            let existing =
                schema::get_value(conn, key).map_err(|e| schema::store_error("cannot read for byte_max", &e))?;
            Self::put(conn, key, &ops::byte_max(existing.as_deref(), value))?;
            Ok(Written::Key(key.to_vec()))
        });
    }

    pub(super) fn set_versionstamped(&self, key: &[u8], value: &[u8], stamp_key: bool) {
        if stamp_key {
            if let Ok((bytes, offset)) = ops::split_versionstamp_param(key) {
                self.flush_adds(|k| may_be_stamped(k, bytes, offset));
            }
        } else {
            self.note_first_write(key);
            self.flush_adds(|k| k == key);
        }
        self.write(key.len() + value.len(), |conn, commit| {
            // FoundationDB checks the parameter with its 4-byte offset,
            // not the bytes stored: so does this store.
            Self::check_sizes(key, value)?;
            let param = if stamp_key { key } else { value };
            let (bytes, offset) = ops::split_versionstamp_param(param)?;
            let stamp = ops::versionstamp(self.version(conn, commit)?);
            commit.stamped = true;
            let filled = ops::fill_versionstamp(bytes, offset, &stamp);
            if stamp_key {
                Self::put(conn, &filled, value)?;
                Ok(Written::Key(filled))
            } else {
                Self::put(conn, key, &filled)?;
                Ok(Written::Key(key.to_vec()))
            }
        });
        let param = if stamp_key { key } else { value };
        if let Ok((bytes, offset)) = ops::split_versionstamp_param(param) {
            let mut st = self.lock();
            if stamp_key {
                st.unreadable.stamped_key(bytes, offset, self.read_version);
            } else {
                st.unreadable.stamped_value(key);
            }
        }
    }
}
