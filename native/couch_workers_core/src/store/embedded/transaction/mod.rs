//! One transaction of the embedded store.
//!
//! * Write mode (`TxOptions.writes`): the store's in-process writer lock (a
//!   tokio mutex: waiting tasks queue without blocking threads), then
//!   `BEGIN IMMEDIATE` on the store's write connection. SQLITE_BUSY (another
//!   process writes) is retried after an asynchronous jittered sleep until
//!   the transaction's timeout, then [`StoreError::Busy`]; `fair.rs` does
//!   it, and keeps a process that writes back to back from starving the
//!   others. Holding SQLite's
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
//! Versions: fixed as FDB's are, from one clock shared by every process
//! (`version.rs`).
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
//! a `SAVEPOINT`, so that its failure rolls back only its own work; the
//! savepoint's join, keep and rollback are `group.rs`'s.
//!
//! The SQLite calls run inline on the calling (tokio worker) thread: they
//! take microseconds, far less than a hop to a blocking pool would, and
//! they never wait for a lock (busy_timeout is 0). No std mutex is held
//! across an await.
//!
//! | module | job |
//! | --- | --- |
//! | `mod.rs` | [`EmbeddedTransaction`]: its modes, state, reads, release, the [`Transaction`] impl |
//! | `write.rs` | the write operations: size limits, read-mode upgrade, versionstamps, held adds |
//! | `commit.rs` | commit: watches armed, version fixed, alone or in a group commit |
//! | `version.rs` | read and commit versions |

mod commit;
mod version;
mod write;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rusqlite::Connection;
use tokio::sync::OwnedMutexGuard;

use super::adds::PendingAdds;
use super::fair;
use super::schema::{self, SQL_CLEAR, SQL_CLEAR_RANGE, SQL_RANGE_FWD, SQL_RANGE_REV};
use super::unreadable::Unreadable;
use super::watch::{watch_channel, WatchSender, Written};
use super::Shared;
use crate::store::backoff::BackoffPolicy;
use crate::store::{
    CommitInfo, KeyValue, RangeRequest, StoreError, Transaction, TxOptions, Watch, MAX_KEY_SIZE, MAX_TRANSACTION_SIZE,
};
use version::CommitState;

/// How long an upgrade conflict waits for this process's queued writers.
const UPGRADE_WAIT: Duration = Duration::from_millis(100);

/// How a transaction starts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// `BEGIN DEFERRED` on a pooled read connection.
    Read,
    /// `BEGIN IMMEDIATE` on the write connection: this writer opened
    /// SQLite's transaction.
    Write,
    /// On the write connection, inside the SQLite transaction a group
    /// commit left open, under its savepoint (`group.rs`).
    Joined,
}

impl Mode {
    /// Opened as a writer (`TxOptions.writes`), which holds SQLite's
    /// write lock from the start.
    fn writes(self) -> bool {
        self != Mode::Read
    }
}

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

    /// Whether this transaction wrote, cleared or added to `key` (a
    /// writer's held adds are in `written` from the first).
    fn touched(&self, key: &[u8]) -> bool {
        self.written.iter().any(|w| match w {
            Written::Key(k) => k == key,
            Written::Range(begin, end) => begin.as_slice() <= key && key < end.as_slice(),
        })
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
    /// Keys whose writes spare this handle's watches
    /// (`spare_own_watches`), with their values before this transaction
    /// wrote them.
    spared: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// Keys a watch of this store waited on when this transaction first
    /// wrote them, with their values before that write: the watches its
    /// commit fires itself (`watch.rs`, `KeyChange`).
    first_writes: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// `commit` or `on_error` ran.
    finished: bool,
    /// What its versionstamped writes made unreadable (FDB's rule).
    unreadable: Unreadable,
    /// A writer's atomic adds not yet in SQLite (`adds.rs`).
    adds: PendingAdds,
}

pub(crate) struct EmbeddedTransaction {
    shared: Arc<Shared>,
    mode: Mode,
    created: Instant,
    read_version: u64,
    state: Mutex<TxState>,
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
        let guard =
            tokio::time::timeout(timeout, shared.writer.clone().lock_owned()).await.map_err(|_| StoreError::Busy)?;
        drop(queued);
        if !guard.is_autocommit() {
            // A group commit is open: join it (SQLite's lock is ours).
            shared.group.join_open(&guard)?;
            return Self::start(shared, Slot::Writer(guard), Mode::Joined);
        }
        let guard = fair::begin_immediate(&shared, guard, started, timeout).await?;
        // No await from here on: the transaction owns the open SQLite
        // transaction before anything can cancel this future.
        Self::start(shared, Slot::Writer(guard), Mode::Write)
    }

    fn begin_read(shared: Arc<Shared>) -> Result<Self, StoreError> {
        let conn = shared.readers.take()?;
        if let Err(e) = schema::exec_cached(&conn, "BEGIN DEFERRED") {
            return Err(schema::store_error("cannot begin a read transaction", &e));
        }
        Self::start(shared, Slot::Reader(conn), Mode::Read)
    }

    /// Takes the snapshot (reading `last_version` starts SQLite's read
    /// transaction) and fixes the read version.
    fn start(shared: Arc<Shared>, slot: Slot, mode: Mode) -> Result<Self, StoreError> {
        // The clock is read before the snapshot is taken.
        let clock_now = shared.clock.now();
        let on_writer = matches!(slot, Slot::Writer(_));
        let mut state = TxState {
            slot,
            nested: mode == Mode::Joined,
            locked: mode.writes(),
            wrote: false,
            written_bytes: 0,
            commit: CommitState { on_writer, ..CommitState::default() },
            error: None,
            watches: Vec::new(),
            written: Vec::new(),
            spared: Vec::new(),
            first_writes: Vec::new(),
            finished: false,
            unreadable: Unreadable::default(),
            adds: PendingAdds::default(),
        };
        // A writer that joins a batch knows the last version from the
        // group; one that opened the SQLite transaction reads it (another
        // process may have committed) and tells the group.
        let cached = if mode == Mode::Joined { shared.group.last_version() } else { None };
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
            mode,
            created: Instant::now(),
            read_version: version::read_version(last, clock_now),
            state: Mutex::new(state),
        })
    }

    fn lock(&self) -> MutexGuard<'_, TxState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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
}

/// Rolls back whatever is open and gives the connection back (the write
/// connection by dropping the writer lock guard, after the group commit
/// rolled back what it must: `group.rs`).
fn release(shared: &Shared, st: &mut TxState) {
    match std::mem::replace(&mut st.slot, Slot::Released) {
        Slot::Writer(guard) => shared.group.release(&guard, st.nested),
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
        self.read("cannot read", |conn| schema::get_value(conn, key))
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
            let rows = stmt.query_map(rusqlite::params![range.begin, range.end, limit_param(range.limit)], |row| {
                Ok((row.get::<_, Vec<u8>>(0)?, row.get::<_, Vec<u8>>(1)?))
            })?;
            rows.collect()
        })
    }

    async fn read_version(&self) -> Result<u64, StoreError> {
        let mut st = self.lock();
        self.usable(&mut st)?;
        Ok(self.read_version)
    }

    fn set(&self, key: &[u8], value: &[u8]) {
        self.note_first_write(key);
        self.flush_adds(|k| k == key);
        self.write(key.len() + value.len(), |conn, _| {
            Self::check_sizes(key, value)?;
            Self::put(conn, key, value)?;
            Ok(Written::Key(key.to_vec()))
        });
    }

    fn clear(&self, key: &[u8]) {
        self.note_first_write(key);
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
        self.lock().unreadable.cleared_key(key);
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
            Self::add(conn, key, delta)?;
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

    fn spare_own_watches(&self, key: &[u8]) {
        // The value before this transaction's write: read now, it is the
        // last one any other commit left (a writer holds SQLite's write
        // lock; a reader's first write fails unless its snapshot is the
        // latest), which the hub compares with what each watch expects.
        self.flush_adds(|k| k == key);
        let before = self.read("cannot read a spared key", |conn| schema::get_value(conn, key));
        if let Ok(before) = before {
            let mut st = self.lock();
            if !st.spared.iter().any(|(k, _)| k == key) {
                st.spared.push((key.to_vec(), before));
            }
        }
    }

    async fn commit(&self) -> Result<CommitInfo, StoreError> {
        self.commit_all().await
    }

    async fn on_error(&self, err: StoreError) -> Result<(), StoreError> {
        let upgrade_conflict = {
            let mut st = self.lock();
            self.fail(&mut st, err.clone());
            st.finished = true;
            err == StoreError::Conflict && !self.mode.writes()
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
