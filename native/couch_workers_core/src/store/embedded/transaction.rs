//! One transaction of the embedded store.
//!
//! * Write mode (`TxOptions.writes`): the store's in-process writer lock (a
//!   tokio mutex: waiting tasks queue without blocking threads), then
//!   `BEGIN IMMEDIATE` on the store's write connection. SQLITE_BUSY (another
//!   process writes) is retried after an asynchronous jittered sleep until
//!   the transaction's timeout, then [`StoreError::Busy`]; `fair.rs` keeps
//!   a process that writes back to back from starving the others. Holding SQLite's
//!   one write lock for its whole life, the transaction cannot conflict:
//!   reads and writes go straight to SQLite, which gives read-your-writes.
//! * Read mode: `BEGIN DEFERRED` on a pooled read connection, whose WAL
//!   snapshot is taken at once (as FDB takes a read version). A write makes
//!   SQLite upgrade the transaction to a writer; that fails (SQLITE_BUSY or
//!   SQLITE_BUSY_SNAPSHOT) when another connection writes or has committed
//!   since the snapshot, and the transaction then fails with
//!   [`StoreError::Conflict`] (retryable; its `on_error` waits for this
//!   process's writers before the retry). Callers that write should pass
//!   `TxOptions::write()`.
//!
//! Snapshot reads and `add_read_conflict_key` change nothing here: a
//! writer is alone, so nothing can commit between its reads and its commit;
//! a read-mode transaction that writes conflicts with *every* commit since
//! its snapshot (stricter than FDB's per-key conflicts, never looser).
//!
//! Writes return nothing, as in FDB: a limit violation or an SQLite error
//! becomes the transaction's error, rolls it back at once (freeing the
//! write lock), and is returned by every later read and by `commit`.
//!
//! Versions: the read version is fixed when the transaction starts:
//! `max(last_version in its snapshot, clock)`, the clock read first. The
//! commit version is fixed under the write lock when first needed (the
//! first versionstamped operation, else the commit) as
//! `max(last_version + 1, clock + 1)` and stored as `last_version` in the
//! same SQLite transaction, so commit versions strictly increase across
//! every process (on the write connection the group commit keeps
//! `last_version` in memory while SQLite's write lock is held, and stores
//! the highest version of the batch right before its `COMMIT`). As in FDB, a commit's version exceeds the read version of
//! every transaction that started after it committed. Unlike FDB, a
//! transaction that started while another was committing may get a read
//! version above that commit's version without seeing it (the window is
//! from the version being fixed to COMMIT: microseconds, or the rest of the
//! transaction after a versionstamped operation). Anything it then writes
//! conflicts (read mode) or waits for the lock (write mode), so this only
//! matters to read-only decisions.
//!
//! Writers of one process are serialized, awaits included: a closure that
//! holds a write transaction should not wait on anything slow, and must
//! never open a second write transaction (it would wait for itself until
//! its timeout, then fail with `Busy`).
//!
//! A writer's atomic adds are summed per key and written when the
//! transaction commits or one of its operations touches the key
//! (`adds.rs`).
//!
//! Writers that queue behind each other share one SQLite commit
//! (`group.rs`): a writer that finds SQLite's transaction already open
//! (earlier writers left their work in it for a group commit) runs inside
//! a `SAVEPOINT`, so that its failure rolls back only its own work.
//!
//! The SQLite calls run inline on the calling (tokio worker) thread: they
//! take microseconds, far less than a hop to a blocking pool would, and
//! they never wait for a lock (busy_timeout is 0). No std mutex is held
//! across an await.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension};
use tokio::sync::OwnedMutexGuard;

use super::adds::{may_be_stamped, PendingAdds};
use super::fair::STEP_ASIDE;
use super::group;
use crate::store::mutation as ops;
use super::schema::{self, SQL_CLEAR, SQL_CLEAR_RANGE, SQL_GET, SQL_RANGE_FWD, SQL_RANGE_REV, SQL_SET};
use super::unreadable::Unreadable;
use super::watch::{watch_channel, WatchSender, Written};
use super::Shared;
use crate::store::backoff::BackoffPolicy;
use crate::store::{
    CommitInfo, KeyValue, RangeRequest, StoreError, Transaction, TxOptions, Watch, MAX_KEY_SIZE,
    MAX_TRANSACTION_SIZE, MAX_VALUE_SIZE,
};

/// The longest sleep between two attempts to take SQLite's write lock from
/// another process: short, so that this process notices the lock free
/// while the holder steps aside (see `fair.rs`); the holder's transactions
/// last tens of microseconds.
const MAX_LOCK_BACKOFF: Duration = Duration::from_millis(1);

/// How long an upgrade conflict waits for this process's queued writers.
const UPGRADE_WAIT: Duration = Duration::from_millis(100);

/// The connection a transaction runs on.
enum Slot {
    /// The store's write connection, held through the writer lock.
    Writer(OwnedMutexGuard<Connection>),
    /// A pooled read connection.
    Reader(Connection),
    /// Committed, rolled back or failed: the connection went back.
    Released,
}

impl TxState {
    fn writer_with_writes(&self) -> bool {
        self.wrote && matches!(self.slot, Slot::Writer(_))
    }
}

impl Slot {
    fn conn(&self) -> Result<&Connection, StoreError> {
        match self {
            Slot::Writer(guard) => Ok(guard),
            Slot::Reader(conn) => Ok(conn),
            Slot::Released => Err(StoreError::Invalid("the transaction has already finished".into())),
        }
    }
}

/// What a writing transaction knows about its commit.
#[derive(Default)]
struct CommitState {
    /// The commit version, fixed (and stored as `last_version`) when first
    /// needed: by a versionstamped operation or at commit.
    version: Option<u64>,
    /// A versionstamped operation was used.
    stamped: bool,
    /// Runs on the write connection: the last version is kept by the
    /// group commit (`group.rs`) instead of being read and written in
    /// `meta` by every transaction.
    on_writer: bool,
}

struct TxState {
    slot: Slot,
    /// A write transaction that runs inside the open SQLite transaction of
    /// a group commit, under `SAVEPOINT cw`.
    nested: bool,
    /// Holds SQLite's write lock: from the start in write mode, after the
    /// first write in read mode.
    locked: bool,
    /// Something was written (so the commit gets a version).
    wrote: bool,
    written_bytes: usize,
    commit: CommitState,
    /// The first error; everything after it returns it.
    error: Option<StoreError>,
    /// Watches to arm at commit.
    watches: Vec<(Vec<u8>, WatchSender)>,
    /// The keys and ranges written: the local watches they may fire.
    written: Vec<Written>,
    /// `commit` or `on_error` ran.
    finished: bool,
    /// What its versionstamped writes made unreadable (FDB's rule).
    unreadable: Unreadable,
    /// A writer's atomic adds not yet in SQLite (`adds.rs`).
    adds: PendingAdds,
}

pub(crate) struct EmbeddedTransaction {
    shared: Arc<Shared>,
    writes_hint: bool,
    created: Instant,
    read_version: u64,
    state: Mutex<TxState>,
}

/// Jittered sleep before the next attempt to take SQLite's write lock.
fn lock_backoff(attempt: u32) -> Duration {
    use rand::Rng;
    let ceiling = (250u64 << attempt.min(2)).min(MAX_LOCK_BACKOFF.as_micros() as u64);
    Duration::from_micros(rand::rng().random_range(ceiling / 2..=ceiling))
}

fn limit_param(limit: usize) -> i64 {
    if limit == 0 {
        -1
    } else {
        i64::try_from(limit).unwrap_or(i64::MAX)
    }
}

impl EmbeddedTransaction {
    /// Starts a transaction (see the module doc for the two modes).
    pub(crate) async fn begin(shared: Arc<Shared>, opts: &TxOptions) -> Result<Self, StoreError> {
        if shared.is_closed() {
            return Err(StoreError::Closed);
        }
        if opts.writes {
            Self::begin_write(shared, opts.timeout).await
        } else {
            Self::begin_read(shared)
        }
    }

    async fn begin_write(shared: Arc<Shared>, timeout: Duration) -> Result<Self, StoreError> {
        let started = Instant::now();
        let queued = shared.group.queue();
        let guard = tokio::time::timeout(timeout, shared.writer.clone().lock_owned())
            .await
            .map_err(|_| StoreError::Busy)?;
        drop(queued);
        if !guard.is_autocommit() {
            // A group commit is open: join it (SQLite's lock is ours).
            return match schema::exec_cached(&guard, "SAVEPOINT cw") {
                Ok(()) => Self::start(shared, Slot::Writer(guard), true, true, true),
                Err(e) => Err(schema::store_error("cannot begin a write transaction", &e)),
            };
        }
        if shared.fair.should_step_aside() {
            // Another process has been waiting for the lock: let it in.
            tokio::time::sleep(STEP_ASIDE).await;
        }
        let mut attempt = 0u32;
        loop {
            if shared.is_closed() {
                return Err(StoreError::Closed);
            }
            match schema::exec_cached(&guard, "BEGIN IMMEDIATE") {
                Ok(()) => break,
                Err(e) if schema::is_busy(&e) => {
                    // Another process writes. Keep this process's writer
                    // lock meanwhile: the other local writers stay queued
                    // in order instead of all polling SQLite.
                    shared.fair.signal_waiting();
                    attempt += 1;
                    if started.elapsed() >= timeout {
                        return Err(StoreError::Busy);
                    }
                    tokio::time::sleep(lock_backoff(attempt)).await;
                }
                Err(e) => return Err(schema::store_error("cannot begin a write transaction", &e)),
            }
        }
        // No await from here on: the transaction owns the open SQLite
        // transaction before anything can cancel this future.
        Self::start(shared, Slot::Writer(guard), true, true, false)
    }

    fn begin_read(shared: Arc<Shared>) -> Result<Self, StoreError> {
        let conn = shared.readers.take()?;
        if let Err(e) = schema::exec_cached(&conn, "BEGIN DEFERRED") {
            return Err(schema::store_error("cannot begin a read transaction", &e));
        }
        Self::start(shared, Slot::Reader(conn), false, false, false)
    }

    /// Takes the snapshot (reading `last_version` starts SQLite's read
    /// transaction) and fixes the read version.
    fn start(shared: Arc<Shared>, slot: Slot, writes_hint: bool, locked: bool, nested: bool) -> Result<Self, StoreError> {
        // The clock is read before the snapshot is taken.
        let clock_now = shared.clock.now();
        let on_writer = matches!(slot, Slot::Writer(_));
        let mut state = TxState {
            slot,
            nested,
            locked,
            wrote: false,
            written_bytes: 0,
            commit: CommitState { on_writer, ..CommitState::default() },
            error: None,
            watches: Vec::new(),
            written: Vec::new(),
            finished: false,
            unreadable: Unreadable::default(),
            adds: PendingAdds::default(),
        };
        // A writer that joins a batch knows the last version from the
        // group; one that opened the SQLite transaction reads it (another
        // process may have committed) and tells the group.
        let cached = if nested { shared.group.last_version() } else { None };
        let read = || {
            state.slot.conn().and_then(|c| {
                schema::last_version(c).map_err(|e| schema::store_error("cannot read the last version", &e))
            })
        };
        let last = match cached.map_or_else(read, Ok) {
            Ok(last) => {
                if on_writer && cached.is_none() {
                    shared.group.opened_at(last);
                }
                last
            }
            Err(e) => {
                release(&shared, &mut state);
                return Err(e);
            }
        };
        Ok(EmbeddedTransaction {
            shared,
            writes_hint,
            created: Instant::now(),
            read_version: last.max(clock_now),
            state: Mutex::new(state),
        })
    }

    fn lock(&self) -> MutexGuard<'_, TxState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Writes the held adds to the keys the next operation touches, so
    /// that it sees them (and a write or clear of the key comes after
    /// them). A failure fails the transaction.
    fn flush_adds(&self, touched: impl Fn(&[u8]) -> bool) {
        let mut st = self.lock();
        if st.adds.is_empty() {
            return;
        }
        let due = st.adds.take(touched);
        if due.is_empty() || self.usable(&mut st).is_err() {
            return;
        }
        let applied = st.slot.conn().and_then(|conn| {
            due.iter().try_for_each(|(key, delta)| {
                let existing = conn
                    .prepare_cached(SQL_GET)
                    .and_then(|mut s| s.query_row([key], |row| row.get::<_, Vec<u8>>(0)).optional())
                    .map_err(|e| schema::store_error("cannot read for atomic_add", &e))?;
                Self::put(conn, key, &ops::add_le_i64(existing.as_deref(), *delta))
            })
        });
        if let Err(e) = applied {
            self.fail(&mut st, e);
        }
    }

    /// Records `err` as the transaction's error (if it is the first), rolls
    /// back, gives the connection back and fails the pending watches.
    fn fail(&self, st: &mut TxState, err: StoreError) {
        if st.error.is_none() {
            st.error = Some(err.clone());
        }
        release(&self.shared, st);
        for (_, tx) in st.watches.drain(..) {
            let _ = tx.send(Err(err.clone()));
        }
    }

    /// The checks before any operation: a recorded error, finished, age.
    fn usable(&self, st: &mut TxState) -> Result<(), StoreError> {
        if let Some(e) = &st.error {
            return Err(e.clone());
        }
        if st.finished {
            return Err(StoreError::Invalid("the transaction has already finished".into()));
        }
        if self.created.elapsed() > self.shared.max_age {
            self.fail(st, StoreError::TooOld);
            return Err(StoreError::TooOld);
        }
        Ok(())
    }

    fn read<T>(&self, what: &str, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T, StoreError> {
        let mut st = self.lock();
        self.usable(&mut st)?;
        let result = st.slot.conn().and_then(|conn| f(conn).map_err(|e| schema::store_error(what, &e)));
        result.inspect_err(|e| self.fail(&mut st, e.clone()))
    }

    /// Runs one write: checks, counts `bytes` against the transaction size
    /// limit, takes SQLite's write lock in read mode, then `f`.
    fn write(
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

    /// The commit version: fixed under the write lock when first needed.
    fn version(&self, conn: &Connection, commit: &mut CommitState) -> Result<u64, StoreError> {
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

    fn put(conn: &Connection, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        conn.prepare_cached(SQL_SET)
            .and_then(|mut s| s.execute(rusqlite::params![key, value]))
            .map(|_| ())
            .map_err(|e| schema::store_error("cannot write", &e))
    }

    fn check_sizes(key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        if key.len() > MAX_KEY_SIZE {
            return Err(StoreError::KeyTooLarge);
        }
        if value.len() > MAX_VALUE_SIZE {
            return Err(StoreError::ValueTooLarge);
        }
        Ok(())
    }

    fn byte_max(&self, key: &[u8], value: &[u8]) {
        self.flush_adds(|k| k == key);
        self.write(key.len() + value.len(), |conn, _| {
            Self::check_sizes(key, value)?;
            let existing = conn
                .prepare_cached(SQL_GET)
                .and_then(|mut s| s.query_row([key], |row| row.get::<_, Vec<u8>>(0)).optional())
                .map_err(|e| schema::store_error("cannot read for byte_max", &e))?;
            Self::put(conn, key, &ops::byte_max(existing.as_deref(), value))?;
            Ok(Written::Key(key.to_vec()))
        });
    }

    fn set_versionstamped(&self, key: &[u8], value: &[u8], stamp_key: bool) {
        if stamp_key {
            if let Ok((bytes, offset)) = ops::split_versionstamp_param(key) {
                self.flush_adds(|k| may_be_stamped(k, bytes, offset));
            }
        } else {
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

/// Rolls back whatever is open and gives the connection back (the write
/// connection by dropping the writer lock guard). A nested writer rolls
/// back to its savepoint only: the batch it ran in keeps the work of the
/// writers before it.
fn release(shared: &Shared, st: &mut TxState) {
    match std::mem::replace(&mut st.slot, Slot::Released) {
        Slot::Writer(guard) => {
            if guard.is_autocommit() {
                // Nothing open (committed), or SQLite rolled back by
                // itself after an error: then a batch's members lost
                // their work too.
                if st.nested && shared.group.has_members() {
                    let _ = group::commit_batch(&shared.group, &guard);
                }
                shared.group.closed();
            } else if st.nested {
                let undone = schema::exec_cached(&guard, "ROLLBACK TO cw")
                    .and_then(|()| schema::exec_cached(&guard, "RELEASE cw"));
                if undone.is_err() {
                    // The savepoint cannot be trusted: give up the batch.
                    let _ = schema::exec_cached(&guard, "ROLLBACK");
                    let _ = group::commit_batch(&shared.group, &guard);
                }
            } else {
                let _ = schema::exec_cached(&guard, "ROLLBACK");
                shared.group.closed();
            }
        }
        Slot::Reader(conn) => {
            if !conn.is_autocommit() {
                let _ = schema::exec_cached(&conn, "ROLLBACK");
            }
            shared.readers.put(conn);
        }
        Slot::Released => {}
    }
}

impl Drop for EmbeddedTransaction {
    fn drop(&mut self) {
        // Not committed: roll back. Pending watches see their sender
        // dropped and resolve with an error.
        let st = self.state.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        release(&self.shared, st);
    }
}

#[async_trait]
impl Transaction for EmbeddedTransaction {
    async fn get(&self, key: &[u8], _snapshot: bool) -> Result<Option<Vec<u8>>, StoreError> {
        self.lock().unreadable.check_key(key)?;
        self.flush_adds(|k| k == key);
        self.read("cannot read", |conn| {
            conn.prepare_cached(SQL_GET)?.query_row([key], |row| row.get::<_, Vec<u8>>(0)).optional()
        })
    }

    async fn get_range(&self, range: &RangeRequest) -> Result<Vec<KeyValue>, StoreError> {
        if range.begin < range.end {
            self.lock().unreadable.check_range(&range.begin, &range.end)?;
            self.flush_adds(|k| range.begin.as_slice() <= k && k < range.end.as_slice());
        }
        self.read("cannot read a range", |conn| {
            if range.begin >= range.end {
                return Ok(Vec::new());
            }
            let sql = if range.reverse { SQL_RANGE_REV } else { SQL_RANGE_FWD };
            let mut stmt = conn.prepare_cached(sql)?;
            let rows = stmt.query_map(
                rusqlite::params![range.begin, range.end, limit_param(range.limit)],
                |row| Ok((row.get::<_, Vec<u8>>(0)?, row.get::<_, Vec<u8>>(1)?)),
            )?;
            rows.collect()
        })
    }

    async fn read_version(&self) -> Result<u64, StoreError> {
        let mut st = self.lock();
        self.usable(&mut st)?;
        Ok(self.read_version)
    }

    fn set(&self, key: &[u8], value: &[u8]) {
        self.flush_adds(|k| k == key);
        self.write(key.len() + value.len(), |conn, _| {
            Self::check_sizes(key, value)?;
            Self::put(conn, key, value)?;
            Ok(Written::Key(key.to_vec()))
        });
        self.lock().unreadable.overwritten(key);
    }

    fn clear(&self, key: &[u8]) {
        self.flush_adds(|k| k == key);
        self.write(key.len(), |conn, _| {
            if key.len() > MAX_KEY_SIZE {
                return Err(StoreError::KeyTooLarge);
            }
            conn.prepare_cached(SQL_CLEAR)
                .and_then(|mut s| s.execute([key]))
                .map(|_| Written::Key(key.to_vec()))
                .map_err(|e| schema::store_error("cannot clear", &e))
        });
        self.lock().unreadable.overwritten(key);
    }

    fn clear_range(&self, begin: &[u8], end: &[u8]) {
        self.flush_adds(|k| begin <= k && k < end);
        self.write(begin.len() + end.len(), |conn, _| {
            // FDB allows one byte more for range ends (strinc of a full key).
            if begin.len() > MAX_KEY_SIZE + 1 || end.len() > MAX_KEY_SIZE + 1 {
                return Err(StoreError::KeyTooLarge);
            }
            if begin > end {
                return Err(StoreError::Invalid("inverted range in clear_range".into()));
            }
            conn.prepare_cached(SQL_CLEAR_RANGE)
                .and_then(|mut s| s.execute([begin, end]))
                .map(|_| Written::Range(begin.to_vec(), end.to_vec()))
                .map_err(|e| schema::store_error("cannot clear a range", &e))
        });
        self.lock().unreadable.cleared(begin, end);
    }

    fn atomic_add(&self, key: &[u8], delta: i64) {
        {
            let mut st = self.lock();
            if matches!(st.slot, Slot::Writer(_)) {
                // Held until needed (`adds.rs`); checked and counted now.
                if self.usable(&mut st).is_err() {
                    return;
                }
                st.written_bytes = st.written_bytes.saturating_add(key.len() + 8);
                let err = if key.len() > MAX_KEY_SIZE {
                    Some(StoreError::KeyTooLarge)
                } else if st.written_bytes > MAX_TRANSACTION_SIZE {
                    Some(StoreError::TransactionTooLarge)
                } else {
                    None
                };
                match err {
                    Some(e) => self.fail(&mut st, e),
                    None => {
                        st.wrote = true;
                        if st.adds.add(key, delta) {
                            st.written.push(Written::Key(key.to_vec()));
                        }
                    }
                }
                return;
            }
        }
        self.write(key.len() + 8, |conn, _| {
            if key.len() > MAX_KEY_SIZE {
                return Err(StoreError::KeyTooLarge);
            }
            let existing = conn
                .prepare_cached(SQL_GET)
                .and_then(|mut s| s.query_row([key], |row| row.get::<_, Vec<u8>>(0)).optional())
                .map_err(|e| schema::store_error("cannot read for atomic_add", &e))?;
            Self::put(conn, key, &ops::add_le_i64(existing.as_deref(), delta))?;
            Ok(Written::Key(key.to_vec()))
        });
    }

    fn atomic_byte_max(&self, key: &[u8], value: &[u8]) {
        self.byte_max(key, value);
    }

    fn set_versionstamped_key(&self, key: &[u8], value: &[u8]) {
        self.set_versionstamped(key, value, true);
    }

    fn set_versionstamped_value(&self, key: &[u8], value: &[u8]) {
        self.set_versionstamped(key, value, false);
    }

    fn add_read_conflict_key(&self, _key: &[u8]) {
        // Nothing to do: see the module doc (a writer cannot conflict; a
        // read-mode transaction that writes conflicts with every commit).
    }

    fn watch(&self, key: &[u8]) -> Watch {
        let (tx, watch) = watch_channel();
        let mut st = self.lock();
        match self.usable(&mut st) {
            Ok(()) => st.watches.push((key.to_vec(), tx)),
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        }
        watch
    }

    async fn commit(&self) -> Result<CommitInfo, StoreError> {
        self.flush_adds(|_| true);
        if self.shared.group.worth_waiting() && self.lock().writer_with_writes() {
            // About to commit alone while this process's writers come
            // together: let the tasks already ready run first. Those that
            // write queue for the lock, and this commit becomes a group
            // commit that they join (bench/RESULTS.md, "Session 5: J2").
            tokio::task::yield_now().await;
        }
        let mut armed = Vec::new();
        let written;
        let (info, deferred) = {
            let mut st = self.lock();
            if let Err(e) = self.usable(&mut st) {
                self.fail(&mut st, e.clone());
                st.finished = true;
                return Err(e);
            }
            let result = self.commit_locked(&mut st, &mut armed);
            st.finished = true;
            written = std::mem::take(&mut st.written);
            match result {
                Ok((info, deferred)) => {
                    if deferred.is_some() {
                        // The work stays in the batch: let the next writer
                        // in without rolling anything back.
                        st.slot = Slot::Released;
                    } else {
                        release(&self.shared, &mut st);
                    }
                    (info, deferred)
                }
                Err(e) => {
                    self.fail(&mut st, e.clone());
                    for (_, _, tx) in armed {
                        let _ = tx.send(Err(e.clone()));
                    }
                    return Err(e);
                }
            }
        };
        if let Some((seq, outcome)) = deferred {
            if let Err(e) = group::wait(&self.shared, seq, outcome).await {
                self.lock().error = Some(e.clone());
                for (_, _, tx) in armed {
                    let _ = tx.send(Err(e.clone()));
                }
                return Err(e);
            }
        }
        if info.version.is_some() {
            self.shared.watches.notify_commit(&written);
        }
        for (key, value, tx) in armed {
            self.shared.watches.register(key, value, tx);
        }
        Ok(info)
    }

    async fn on_error(&self, err: StoreError) -> Result<(), StoreError> {
        let upgrade_conflict = {
            let mut st = self.lock();
            self.fail(&mut st, err.clone());
            st.finished = true;
            err == StoreError::Conflict && !self.writes_hint
        };
        if !err.is_retryable() {
            return Err(err);
        }
        if upgrade_conflict {
            // A read-mode transaction lost its upgrade, most likely to a
            // writer: let this process's queued writers go first.
            let _ = tokio::time::timeout(UPGRADE_WAIT, self.shared.writer.clone().lock_owned()).await;
        }
        tokio::time::sleep(BackoffPolicy::LOCAL.delay(1)).await;
        Ok(())
    }
}

/// A watch to arm: key, the value the transaction saw, its sender.
type Armed = (Vec<u8>, Option<Vec<u8>>, WatchSender);

impl EmbeddedTransaction {
    /// Reads the watched values, fixes the version, commits. The watches
    /// go to `armed`, also on failure (the caller fails them).
    /// A writer that leaves its commit to the group (`group.rs`) gets the
    /// batch to wait for.
    fn commit_locked(
        &self,
        st: &mut TxState,
        armed: &mut Vec<Armed>,
    ) -> Result<(CommitInfo, Option<(u64, group::Outcome)>), StoreError> {
        let watches = std::mem::take(&mut st.watches);
        let TxState { slot, wrote, commit, nested, .. } = st;
        let writer = matches!(slot, Slot::Writer(_));
        let conn = match slot.conn() {
            Ok(conn) => conn,
            Err(e) => {
                armed.extend(watches.into_iter().map(|(k, tx)| (k, None, tx)));
                return Err(e);
            }
        };
        // The values the watches were set on: this transaction's view.
        let mut failure = None;
        for (key, tx) in watches {
            let value = if failure.is_some() {
                None
            } else {
                let read = conn
                    .prepare_cached(SQL_GET)
                    .and_then(|mut s| s.query_row([&key], |row| row.get::<_, Vec<u8>>(0)).optional());
                read.unwrap_or_else(|e| {
                    failure = Some(schema::store_error("cannot read a watched key", &e));
                    None
                })
            };
            armed.push((key, value, tx));
        }
        if let Some(err) = failure {
            return Err(err);
        }
        let info = if *wrote {
            let version = self.version(conn, commit)?;
            CommitInfo { version: Some(version), versionstamp: commit.stamped.then(|| ops::versionstamp(version)) }
        } else {
            CommitInfo::default()
        };
        if !writer {
            schema::exec_cached(conn, "COMMIT").map_err(|e| schema::store_error("cannot commit", &e))?;
            return Ok((info, None));
        }
        if *nested {
            schema::exec_cached(conn, "RELEASE cw").map_err(|e| schema::store_error("cannot commit", &e))?;
            // Its work now belongs to the batch: a failure from here on
            // must not roll back to a savepoint that is gone.
            *nested = false;
        }
        if self.shared.group.should_defer() {
            return Ok((info, Some(self.shared.group.join())));
        }
        group::commit_batch(&self.shared.group, conn)?;
        Ok((info, None))
    }
}
