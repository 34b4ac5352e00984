//! The SQLite file: its tables, the settings of every connection, the
//! one-time setup of a store, and the mapping of SQLite errors.
//!
//! ```text
//! kv(key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID
//!     the key space: FDB's ordered byte keys (SQLite orders BLOBs by memcmp,
//!     then length: FoundationDB's order)
//! meta(name TEXT PRIMARY KEY, value) WITHOUT ROWID
//!     'format'        = 1 (the layout of this file)
//!     'last_version'  = the last commit version (INTEGER)
//!     'boot_id'       = the host boot the clock base belongs to (TEXT)
//!     'clock_base'    = the clock base of that boot, µs (INTEGER)
//! ```

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::{ffi, Connection, OpenFlags, OptionalExtension};

use super::clock::{boot_id, Clock};
use super::holders;
use super::{EmbeddedOptions, Synchronous};
use crate::store::StoreError;

/// The file every process of the store opens, inside the store's directory.
pub const FILE_NAME: &str = "couch_workers.sqlite";

/// The layout of the file written by this code.
const FORMAT: i64 = 1;

pub(crate) const SQL_GET: &str = "SELECT value FROM kv WHERE key = ?1";
pub(crate) const SQL_SET: &str =
    "INSERT INTO kv(key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value";
/// An atomic add in one statement: `?2` added to the row's 8-byte
/// little-endian value (a missing row as zero), by [`SQL_FN_ADD`].
pub(crate) const SQL_ADD: &str = "INSERT INTO kv(key, value) VALUES (?1, cw_add_le(NULL, ?2)) \
     ON CONFLICT(key) DO UPDATE SET value = cw_add_le(value, ?2)";
/// The SQL function of [`SQL_ADD`], registered on every connection.
pub(crate) const SQL_FN_ADD: &str = "cw_add_le";
pub(crate) const SQL_CLEAR: &str = "DELETE FROM kv WHERE key = ?1";
pub(crate) const SQL_CLEAR_RANGE: &str = "DELETE FROM kv WHERE key >= ?1 AND key < ?2";
pub(crate) const SQL_RANGE_FWD: &str =
    "SELECT key, value FROM kv WHERE key >= ?1 AND key < ?2 ORDER BY key ASC LIMIT ?3";
pub(crate) const SQL_RANGE_REV: &str =
    "SELECT key, value FROM kv WHERE key >= ?1 AND key < ?2 ORDER BY key DESC LIMIT ?3";
const SQL_META_GET: &str = "SELECT value FROM meta WHERE name = ?1";
const SQL_META_SET: &str =
    "INSERT INTO meta(name, value) VALUES (?1, ?2) ON CONFLICT(name) DO UPDATE SET value = excluded.value";
/// A write that changes nothing: makes a read-mode transaction take
/// SQLite's write lock (or fail at once if its snapshot is stale).
pub(crate) const SQL_TAKE_WRITE_LOCK: &str = "UPDATE meta SET value = value WHERE name = 'last_version'";

/// How long the one-time setup of [`open_store_file`] waits for other
/// processes doing the same (it runs once per open, off the hot path).
const SETUP_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`open_store_file`] starts over while other processes hold
/// the file locked (each attempt also waits up to [`SETUP_BUSY_TIMEOUT`]
/// where SQLite lets it).
const OPEN_WAIT: Duration = Duration::from_secs(10);

/// The page size of a new file (an existing file keeps its own). 1 KiB
/// rather than SQLite's 4 KiB: a job commit touches a few rows on
/// several pages, and each touched page is a whole WAL frame. Measured on
/// the core (`bench/run --only core`, 2 runs each): J1 in one task 17.5k
/// -> 22.0k jobs/s; J2 unchanged (17.4-17.9k); J1b through the API 90k ->
/// 80-82k (bulk inserts fill more, smaller pages).
const PAGE_SIZE: i64 = 1024;

/// The WAL is truncated back to this size when it is reset.
const JOURNAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;

/// Opens one connection with the settings every connection of the store
/// uses. `busy_timeout` is 0: a locked database is reported at once
/// (SQLITE_BUSY) and the caller backs off asynchronously instead of
/// blocking a thread inside SQLite.
pub(crate) fn open_connection(path: &Path, opts: &EmbeddedOptions) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)
        .map_err(|e| io_error(&format!("cannot open {}", path.display()), &e))?;
    configure(&conn, opts).map_err(|e| io_error(&format!("cannot configure {}", path.display()), &e))?;
    Ok(conn)
}

fn configure(conn: &Connection, opts: &EmbeddedOptions) -> rusqlite::Result<()> {
    // Settings such as `synchronous` read the file's schema, which another
    // process may hold locked for a moment (switching a new file to WAL,
    // creating its tables, recovering the WAL of a store nobody had open):
    // wait for it here, once per connection, then never again.
    conn.busy_timeout(SETUP_BUSY_TIMEOUT)?;
    // Per connection: every connection may commit.
    let sync = match opts.synchronous {
        Synchronous::Normal => "NORMAL",
        Synchronous::Full => "FULL",
    };
    conn.pragma_update(None, "synchronous", sync)?;
    // No checkpoint inside a commit: the store's checkpoint thread runs
    // them (`checkpoint.rs`).
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    conn.pragma_update(None, "journal_size_limit", JOURNAL_SIZE_LIMIT)?;
    // The query planner's stability guarantee: a cached statement keeps
    // its plan whatever values are bound. Without it SQLite re-prepares a
    // range read whenever its `LIMIT ?` changes between 0/1 and other
    // values (and, with the bundled STAT4, on range bounds): 5 % of J2's
    // CPU went to re-parsing (`sqlite3Reprepare`). Every statement here is
    // a primary-key lookup or range scan: one plan fits all values.
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    conn.set_prepared_statement_cache_capacity(32);
    register_add(conn)?;
    conn.busy_timeout(Duration::ZERO)?;
    Ok(())
}

/// Registers [`SQL_FN_ADD`]: FoundationDB's ADD on a value and a delta
/// (`store::mutation::add_le_i64`), so that an atomic add is one
/// statement ([`SQL_ADD`]) and not a read and a write: every job
/// transaction moves two counters.
pub(crate) fn register_add(conn: &Connection) -> rusqlite::Result<()> {
    use rusqlite::functions::FunctionFlags;
    let flags = FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC | FunctionFlags::SQLITE_DIRECTONLY;
    conn.create_scalar_function(SQL_FN_ADD, 2, flags, |ctx| {
        let existing = match ctx.get_raw(0) {
            rusqlite::types::ValueRef::Blob(b) => Some(b),
            _ => None,
        };
        let delta: i64 = ctx.get(1)?;
        Ok(crate::store::mutation::add_le_i64(existing, delta).to_vec())
    })
}

/// Creates the directory and the file if missing, switches the file to WAL,
/// creates the tables, and starts this boot's clock if no process has yet.
/// Returns the setup connection (to become the store's writer) and the
/// clock. Other processes may run this at the same moment: it waits for
/// them (a blocking busy timeout, acceptable once per open).
///
/// SQLite answers "locked" without calling the busy handler where waiting
/// could deadlock (a connection that holds a read lock and asks for more,
/// as the WAL switch and the setup transaction do on a new file), so a
/// busy answer starts the attempt over on a new connection, until
/// [`OPEN_WAIT`] has passed: then the error names the directory and the
/// processes holding locks on the file.
pub(crate) fn open_store_file(opts: &EmbeddedOptions) -> Result<(Connection, Clock), StoreError> {
    std::fs::create_dir_all(&opts.dir)
        .map_err(|e| StoreError::Io(format!("cannot create the store directory {}: {e}", opts.dir.display())))?;
    let path = opts.dir.join(FILE_NAME);
    let started = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        match open_attempt(&path, opts) {
            Err(Attempt::Busy(_)) if started.elapsed() < OPEN_WAIT => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(Attempt::Busy(e)) => {
                return Err(StoreError::Io(format!(
                    "cannot open the store in {}: its file stayed locked by another process for {:?} ({}): {e}",
                    opts.dir.display(),
                    started.elapsed(),
                    holders::describe(&path)
                )))
            }
            Err(Attempt::Failed(e)) => return Err(e),
            Ok(opened) => return Ok(opened),
        }
    }
}

/// Why one attempt at [`open_store_file`] failed.
enum Attempt {
    /// Another process held the file's lock: worth trying again.
    Busy(rusqlite::Error),
    Failed(StoreError),
}

fn busy_or(what: &str, path: &Path, e: rusqlite::Error) -> Attempt {
    if is_busy(&e) {
        Attempt::Busy(e)
    } else {
        Attempt::Failed(io_error(&format!("{what} {}", path.display()), &e))
    }
}

fn open_attempt(path: &Path, opts: &EmbeddedOptions) -> Result<(Connection, Clock), Attempt> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(|e| busy_or("cannot open", path, e))?;
    configure(&conn, opts).map_err(|e| busy_or("cannot configure", path, e))?;
    // SQLite falls back to a read-only descriptor when the file cannot be
    // opened for writing (a read-only mount, an immutable file). A store
    // opened so could never write, not even once the file system is
    // writable again (its write connection is opened once, here): refuse
    // it now, with the reason, rather than run a node whose every write
    // fails for as long as it runs.
    if conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(false) {
        return Err(Attempt::Failed(StoreError::Io(format!(
            "cannot open {} for writing: the store's file or directory is read-only",
            path.display()
        ))));
    }
    let setup = |conn: &Connection| -> rusqlite::Result<Result<Clock, StoreError>> {
        conn.busy_timeout(SETUP_BUSY_TIMEOUT)?;
        conn.pragma_update(None, "page_size", PAGE_SIZE)?;
        let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Ok(Err(StoreError::Io(format!(
                "{}: cannot switch to WAL mode (journal_mode is {mode}); is the file system local?",
                path.display()
            ))));
        }
        // Usually another process (or an earlier run on this boot) has set
        // everything up: check in a read transaction, which never waits
        // for the writers of other processes.
        conn.execute_batch("BEGIN DEFERRED")?;
        let ready = existing_clock(conn);
        conn.execute_batch(if ready.is_ok() { "COMMIT" } else { "ROLLBACK" })?;
        if let Some(clock) = ready? {
            conn.busy_timeout(Duration::ZERO)?;
            return Ok(Ok(clock));
        }
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let result = init_in_transaction(conn);
        match result {
            Ok(Ok(clock)) => {
                conn.execute_batch("COMMIT")?;
                conn.busy_timeout(Duration::ZERO)?;
                Ok(Ok(clock))
            }
            other => {
                let _ = conn.execute_batch("ROLLBACK");
                other
            }
        }
    };
    match setup(&conn) {
        Ok(Ok(clock)) => Ok((conn, clock)),
        Ok(Err(e)) => Err(Attempt::Failed(e)),
        Err(e) => Err(busy_or("cannot set up the store in", path, e)),
    }
}

/// The clock of this boot when the file is fully set up for it.
fn existing_clock(conn: &Connection) -> rusqlite::Result<Option<Clock>> {
    let tables: i64 = conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('kv', 'meta')",
        [],
        |row| row.get(0),
    )?;
    if tables != 2 || meta_i64(conn, "format")? != Some(FORMAT) || meta_i64(conn, "last_version")?.is_none() {
        return Ok(None);
    }
    let stored_boot: Option<String> =
        conn.query_row(SQL_META_GET, ["boot_id"], |row| row.get::<_, Option<String>>(0)).optional()?.flatten();
    if stored_boot.as_deref() != Some(boot_id().as_str()) {
        return Ok(None);
    }
    Ok(meta_i64(conn, "clock_base")?.map(Clock::new))
}

fn init_in_transaction(conn: &Connection) -> rusqlite::Result<Result<Clock, StoreError>> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
         CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value) WITHOUT ROWID;",
    )?;
    match meta_i64(conn, "format")? {
        None => meta_set(conn, "format", &FORMAT)?,
        Some(FORMAT) => {}
        Some(other) => {
            return Ok(Err(StoreError::Io(format!(
                "the store file has format {other}; this couch_workers reads format {FORMAT}"
            ))))
        }
    }
    let last = last_version(conn)?;
    if meta_i64(conn, "last_version")?.is_none() {
        meta_set(conn, "last_version", &0i64)?;
    }
    let current_boot = boot_id();
    let stored_boot: Option<String> =
        conn.query_row(SQL_META_GET, ["boot_id"], |row| row.get::<_, Option<String>>(0)).optional()?.flatten();
    let stored_base = meta_i64(conn, "clock_base")?;
    let base = match stored_base {
        Some(base) if stored_boot.as_deref() == Some(current_boot.as_str()) => base,
        _ => {
            let base = Clock::base_for_new_boot(last);
            meta_set(conn, "boot_id", &current_boot)?;
            meta_set(conn, "clock_base", &base)?;
            base
        }
    };
    Ok(Ok(Clock::new(base)))
}

fn meta_i64(conn: &Connection, name: &str) -> rusqlite::Result<Option<i64>> {
    Ok(conn.prepare_cached(SQL_META_GET)?.query_row([name], |row| row.get::<_, Option<i64>>(0)).optional()?.flatten())
}

fn meta_set(conn: &Connection, name: &str, value: &dyn rusqlite::ToSql) -> rusqlite::Result<()> {
    conn.prepare_cached(SQL_META_SET)?.execute(rusqlite::params![name, value])?;
    Ok(())
}

/// The last commit version, as this connection's transaction sees it.
pub(crate) fn last_version(conn: &Connection) -> rusqlite::Result<u64> {
    Ok(meta_i64(conn, "last_version")?.map(|v| u64::try_from(v).unwrap_or(0)).unwrap_or(0))
}

/// Stores a new last commit version (inside the committing transaction).
pub(crate) fn set_last_version(conn: &Connection, version: u64) -> rusqlite::Result<()> {
    let v = i64::try_from(version).unwrap_or(i64::MAX);
    meta_set(conn, "last_version", &v)
}

/// The value of `key` as this connection's transaction sees it.
pub(crate) fn get_value(conn: &Connection, key: &[u8]) -> rusqlite::Result<Option<Vec<u8>>> {
    conn.prepare_cached(SQL_GET)?.query_row([key], |row| row.get::<_, Vec<u8>>(0)).optional()
}

/// Runs a statement without parameters or rows (`BEGIN IMMEDIATE`,
/// `COMMIT`, ...) through the connection's statement cache: these run on
/// every transaction, and `execute_batch` would parse them every time.
pub(crate) fn exec_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// `PRAGMA data_version`: changes whenever another connection commits.
pub(crate) fn data_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.prepare_cached("PRAGMA data_version")?.query_row([], |row| row.get(0))
}

/// Whether SQLite answered "locked by someone else" (SQLITE_BUSY and its
/// extended codes, BUSY_SNAPSHOT included; SQLITE_LOCKED).
pub(crate) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(e.sqlite_error_code(), Some(ffi::ErrorCode::DatabaseBusy | ffi::ErrorCode::DatabaseLocked))
}

/// Maps an SQLite error met while running a transaction.
pub(crate) fn store_error(what: &str, e: &rusqlite::Error) -> StoreError {
    if is_busy(e) {
        StoreError::Busy
    } else {
        io_error(what, e)
    }
}

/// An [`StoreError::Io`] with a message that names the likely cause.
pub(crate) fn io_error(what: &str, e: &rusqlite::Error) -> StoreError {
    let hint = match e.sqlite_error_code() {
        Some(ffi::ErrorCode::DiskFull) => " (disk full)",
        Some(ffi::ErrorCode::SystemIoFailure) => {
            " (the store's files could not be written or read: a read-only, immutable or failing file system?)"
        }
        Some(ffi::ErrorCode::ReadOnly) => " (the store's file or directory is read-only)",
        Some(ffi::ErrorCode::CannotOpen) => {
            " (cannot open the file: missing directory, no permission, or a read-only file system)"
        }
        Some(ffi::ErrorCode::PermissionDenied) => " (permission denied)",
        Some(ffi::ErrorCode::DatabaseCorrupt) => " (the store's file is corrupt)",
        Some(ffi::ErrorCode::NotADatabase) => " (not an SQLite file)",
        _ => "",
    };
    StoreError::Io(format!("{what}: {e}{hint}"))
}
