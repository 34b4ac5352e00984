//! The three engines that replay the shape: the embedded store through its
//! own `Transaction` API, bare SQLite with the store's schema and
//! settings (its checkpoint thread too), and LMDB (heed). Each runs a list of jobs on some threads and
//! says how many commits that took.

use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::{Database, Db, RangeRequest, TxOptions};
use heed::types::Bytes;
use heed::{EnvFlags, EnvOpenOptions};
use rusqlite::{params, Connection, ErrorCode, OptionalExtension};

use crate::shape::{add_value, fill_stamp, Op, Shape, TxShape};

/// Which engine, with its durability setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Embedded,
    Sqlite,
    /// MDB_NOSYNC: no fsync at commit.
    LmdbNoSync,
    /// MDB_NOMETASYNC: one fsync of the data pages per commit, the meta
    /// page left to the OS.
    LmdbNoMetaSync,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Embedded => "embedded",
            Kind::Sqlite => "sqlite",
            Kind::LmdbNoSync => "lmdb_nosync",
            Kind::LmdbNoMetaSync => "lmdb_nometasync",
        }
    }
    pub fn try_parse(s: &str) -> Option<Kind> {
        [Kind::Embedded, Kind::Sqlite, Kind::LmdbNoSync, Kind::LmdbNoMetaSync].into_iter().find(|k| k.name() == s)
    }
    pub fn parse(s: &str) -> Kind {
        Kind::try_parse(s).expect("engine name")
    }
}

/// An open engine, shared by the threads of one process.
pub enum Engine {
    Embedded { store: Arc<EmbeddedStore>, rt: tokio::runtime::Runtime },
    Sqlite { path: std::path::PathBuf, writer: Arc<Mutex<()>>, checkpointer: Checkpointer },
    Lmdb { env: heed::Env, db: heed::Database<Bytes, Bytes> },
}

const LMDB_MAP_SIZE: usize = 4 << 30;
const VERSION_KEY: &[u8] = b"\x00last_version";

pub fn open_lmdb(
    dir: &Path,
    flags: EnvFlags,
    map_size: usize,
) -> heed::Result<(heed::Env, heed::Database<Bytes, Bytes>)> {
    std::fs::create_dir_all(dir).unwrap();
    // SAFETY: the benchmark opens each directory once per process and
    // never truncates or edits the files behind LMDB's back.
    let env = unsafe { EnvOpenOptions::new().map_size(map_size).max_readers(126).flags(flags).open(dir)? };
    let mut wtxn = env.write_txn()?;
    let db = env.create_database(&mut wtxn, None)?;
    wtxn.commit()?;
    Ok((env, db))
}

fn sqlite_conn(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("open sqlite");
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    conn.pragma_update(None, "page_size", 1024).unwrap();
    let _: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0)).unwrap();
    conn.busy_timeout(Duration::ZERO).unwrap();
    conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
    // As in the store: no checkpoint inside a commit (`Checkpointer`).
    conn.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
    conn.pragma_update(None, "journal_size_limit", 64 * 1024 * 1024).unwrap();
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true).unwrap();
    conn.set_prepared_statement_cache_capacity(32);
    conn
}

/// Runs `f` again while SQLite answers SQLITE_BUSY (another process holds
/// the lock), as the store's retry loop does, with a short sleep.
/// Time the bare engines' writers held the write lock (from the lock
/// taken to the commit done), ns: the serialized part of a job.
pub static WRITER_HELD_NS: AtomicU64 = AtomicU64::new(0);

/// SQLITE_BUSY answers met (printed with each bare SQLite run).
pub static SQLITE_BUSY: AtomicU64 = AtomicU64::new(0);

fn retry_busy<T>(mut f: impl FnMut() -> rusqlite::Result<T>) -> T {
    loop {
        match f() {
            Ok(v) => return v,
            Err(rusqlite::Error::SqliteFailure(e, _)) if e.code == ErrorCode::DatabaseBusy => {
                SQLITE_BUSY.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(50))
            }
            Err(e) => panic!("sqlite: {e}"),
        }
    }
}

impl Engine {
    pub fn open(kind: Kind, dir: &Path) -> Engine {
        match kind {
            Kind::Embedded => {
                let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
                // Two processes opening a store that no process holds open
                // can meet one's WAL recovery: the other's open then
                // answers "database is locked" (seen once in 17 runs), so
                // a child tries again.
                let mut tries = 0;
                let store = loop {
                    match EmbeddedStore::open(EmbeddedOptions::new(dir)) {
                        Ok(store) => break store,
                        Err(e) if tries < 100 => {
                            tries += 1;
                            eprintln!("open the store, try {tries}: {e}");
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        Err(e) => panic!("open the store: {e}"),
                    }
                };
                Engine::Embedded { store, rt }
            }
            Kind::Sqlite => {
                std::fs::create_dir_all(dir).unwrap();
                let path = dir.join("bare.sqlite");
                let conn = sqlite_conn(&path);
                // The processes of a shared run open it at the same time.
                retry_busy(|| {
                    conn.execute_batch(
                        "CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
                         CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value) WITHOUT ROWID;
                         INSERT OR IGNORE INTO meta VALUES ('last_version', 0);",
                    )
                });
                let writer = Arc::new(Mutex::new(()));
                let checkpointer = Checkpointer::start(&path, writer.clone());
                Engine::Sqlite { path, writer, checkpointer }
            }
            Kind::LmdbNoSync | Kind::LmdbNoMetaSync => {
                let flags = if kind == Kind::LmdbNoSync { EnvFlags::NO_SYNC } else { EnvFlags::NO_META_SYNC };
                let (env, db) = open_lmdb(dir, flags, LMDB_MAP_SIZE).expect("open lmdb");
                Engine::Lmdb { env, db }
            }
        }
    }

    /// Writes the shape's shared keys and `jobs` jobs' pending keys.
    pub fn fill(&self, shape: &Shape, jobs: u64) {
        let mut items = shape.shared.clone();
        for n in 0..jobs {
            items.extend(shape.fill_for(n));
        }
        for chunk in items.chunks(1000) {
            let tx = TxShape { writes: true, ops: chunk.iter().map(|(k, v)| Op::Set(k.clone(), v.clone())).collect() };
            self.commit_group(&[tx], &mut None);
        }
    }

    /// Runs the jobs `next` hands out (an index into `jobs`) on `threads`
    /// threads (tasks, on the embedded store), `group` writing
    /// transactions per commit (bare engines only; the embedded store
    /// groups by itself). Returns the commits.
    pub fn run(&self, shape: &Shape, jobs: &[u64], threads: usize, group: usize) -> u64 {
        let next = AtomicUsize::new(0);
        let commits = AtomicU64::new(0);
        if let Engine::Embedded { store, rt } = self {
            let db: Db = store.clone();
            let before = store.sqlite_commits();
            rt.block_on(async {
                let next = Arc::new(next);
                let tasks: Vec<_> = (0..threads)
                    .map(|_| {
                        let (db, next, shape, jobs) = (db.clone(), next.clone(), shape.clone(), jobs.to_vec());
                        tokio::spawn(async move {
                            while let Some(&n) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                                for tx in shape.instantiate(n) {
                                    embedded_tx(&db, &tx).await;
                                }
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.unwrap();
                }
            });
            return store.sqlite_commits() - before;
        }
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    let mut conn = None;
                    let mut batch = Vec::new();
                    while let Some(&n) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                        for tx in shape.instantiate(n) {
                            if !tx.writes_anything() {
                                self.read_only(&tx, &mut conn);
                                continue;
                            }
                            batch.push(tx);
                            if batch.len() >= group {
                                self.commit_group(&batch, &mut conn);
                                commits.fetch_add(1, Ordering::Relaxed);
                                batch.clear();
                            }
                        }
                    }
                    if !batch.is_empty() {
                        self.commit_group(&batch, &mut conn);
                        commits.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        commits.load(Ordering::Relaxed)
    }

    fn read_only(&self, tx: &TxShape, conn: &mut Option<Connection>) {
        match self {
            Engine::Sqlite { path, .. } => {
                let conn = conn.get_or_insert_with(|| sqlite_conn(path));
                retry_busy(|| conn.execute_batch("BEGIN DEFERRED"));
                for op in &tx.ops {
                    sqlite_op(conn, op, 0, &mut 0);
                }
                retry_busy(|| conn.execute_batch("COMMIT"));
            }
            Engine::Lmdb { env, db } => {
                let rtxn = env.read_txn().unwrap();
                for op in &tx.ops {
                    lmdb_read(db, &rtxn, op);
                }
            }
            Engine::Embedded { .. } => unreachable!("the embedded store runs in run()"),
        }
    }

    /// One commit of every transaction of `txs`.
    fn commit_group(&self, txs: &[TxShape], conn: &mut Option<Connection>) {
        match self {
            Engine::Embedded { store, rt } => {
                let db: Db = store.clone();
                rt.block_on(async {
                    for tx in txs {
                        embedded_tx(&db, tx).await;
                    }
                });
            }
            Engine::Sqlite { path, writer, .. } => {
                let conn = conn.get_or_insert_with(|| sqlite_conn(path));
                // The store's in-process writer lock: threads queue here,
                // not in SQLite's busy loop.
                let _lock = writer.lock().unwrap();
                let held = Instant::now();
                retry_busy(|| conn.execute_batch("BEGIN IMMEDIATE"));
                let last: i64 = conn
                    .prepare_cached("SELECT value FROM meta WHERE name = 'last_version'")
                    .unwrap()
                    .query_row([], |r| r.get(0))
                    .unwrap();
                let version = last as u64 + 1;
                let mut order = 0u16;
                for tx in txs {
                    for op in &tx.ops {
                        sqlite_op(conn, op, version, &mut order);
                    }
                }
                conn.prepare_cached("UPDATE meta SET value = ?1 WHERE name = 'last_version'")
                    .unwrap()
                    .execute([version as i64])
                    .unwrap();
                retry_busy(|| conn.execute_batch("COMMIT"));
                WRITER_HELD_NS.fetch_add(held.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
            Engine::Lmdb { env, db } => {
                let mut wtxn = env.write_txn().unwrap();
                let held = Instant::now();
                let last = db.get(&wtxn, VERSION_KEY).unwrap().map(|v| u64::from_be_bytes(v.try_into().unwrap()));
                let version = last.unwrap_or(0) + 1;
                db.put(&mut wtxn, VERSION_KEY, &version.to_be_bytes()).unwrap();
                let mut order = 0u16;
                for tx in txs {
                    for op in &tx.ops {
                        lmdb_write(db, &mut wtxn, op, version, &mut order);
                    }
                }
                wtxn.commit().unwrap();
                WRITER_HELD_NS.fetch_add(held.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
        }
    }

    pub fn close(self) {
        match self {
            Engine::Embedded { store, rt } => {
                store.close();
                drop(rt);
            }
            Engine::Lmdb { env, .. } => {
                let closing = env.prepare_for_closing();
                closing.wait();
            }
            Engine::Sqlite { checkpointer, .. } => checkpointer.stop(),
        }
    }
}

/// The store's checkpoint policy, simplified (`store/embedded/checkpoint.rs`
/// has the real one): a thread with its own connection runs PASSIVE
/// checkpoints off the commit path; once the WAL has passed
/// [`RESTART_AT`] frames it checkpoints again holding the in-process
/// writer lock, so that it reaches the WAL's end and the next writer
/// starts the log over.
pub struct Checkpointer {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

const RESTART_AT: i64 = 4000;

impl Checkpointer {
    fn start(path: &Path, writer: Arc<Mutex<()>>) -> Checkpointer {
        let stop = Arc::new(AtomicBool::new(false));
        let (path, stop2) = (path.to_path_buf(), stop.clone());
        let thread = std::thread::spawn(move || {
            let conn = sqlite_conn(&path);
            let pass = || -> (i64, i64) {
                conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| Ok((r.get(1)?, r.get(2)?))).unwrap_or((0, 0))
            };
            while !stop2.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(5));
                let (log, done) = pass();
                if log > RESTART_AT && done < log {
                    let _lock = writer.lock().unwrap();
                    pass();
                }
            }
        });
        Checkpointer { stop, thread }
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
    }
}

async fn embedded_tx(db: &Db, shape: &TxShape) {
    let opts = if shape.writes { TxOptions::write() } else { TxOptions::read() };
    // The shape's transactions never conflict in this replay (each job's
    // keys are its own; the shared counters are atomic adds): one attempt.
    let tx = db.create_transaction(&opts).await.expect("begin");
    for op in &shape.ops {
        match op {
            Op::Get(k) => {
                tx.get(k, false).await.expect("get");
            }
            Op::Range { begin, end, limit, reverse } => {
                let r = RangeRequest::new(begin.clone(), end.clone()).limit(*limit).reverse(*reverse);
                tx.get_range(&r).await.expect("range");
            }
            Op::Set(k, v) => tx.set(k, v),
            Op::Clear(k) => tx.clear(k),
            Op::ClearRange(b, e) => tx.clear_range(b, e),
            Op::Add(k, d) => tx.atomic_add(k, *d),
            Op::ByteMax(k, v) => tx.atomic_byte_max(k, v),
            Op::StampKey(k, v) => tx.set_versionstamped_key(k, v),
            Op::StampValue(k, v) => tx.set_versionstamped_value(k, v),
            Op::Other => {}
        }
    }
    tx.commit().await.expect("commit");
}

const SQL_GET: &str = "SELECT value FROM kv WHERE key = ?1";
const SQL_SET: &str =
    "INSERT INTO kv(key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value";

fn sqlite_get(conn: &Connection, k: &[u8]) -> Option<Vec<u8>> {
    conn.prepare_cached(SQL_GET).unwrap().query_row([k], |r| r.get(0)).optional().unwrap()
}

fn sqlite_set(conn: &Connection, k: &[u8], v: &[u8]) {
    conn.prepare_cached(SQL_SET).unwrap().execute(params![k, v]).unwrap();
}

fn sqlite_op(conn: &Connection, op: &Op, version: u64, order: &mut u16) {
    match op {
        Op::Get(k) => {
            sqlite_get(conn, k);
        }
        Op::Range { begin, end, limit, reverse } => {
            let sql = if *reverse {
                "SELECT key, value FROM kv WHERE key >= ?1 AND key < ?2 ORDER BY key DESC LIMIT ?3"
            } else {
                "SELECT key, value FROM kv WHERE key >= ?1 AND key < ?2 ORDER BY key ASC LIMIT ?3"
            };
            let limit = if *limit == 0 { -1 } else { *limit as i64 };
            let mut stmt = conn.prepare_cached(sql).unwrap();
            let rows =
                stmt.query_map(params![begin, end, limit], |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, Vec<u8>>(1)?)));
            rows.unwrap().for_each(drop);
        }
        Op::Set(k, v) => sqlite_set(conn, k, v),
        Op::Clear(k) => {
            conn.prepare_cached("DELETE FROM kv WHERE key = ?1").unwrap().execute([k]).unwrap();
        }
        Op::ClearRange(b, e) => {
            conn.prepare_cached("DELETE FROM kv WHERE key >= ?1 AND key < ?2").unwrap().execute([b, e]).unwrap();
        }
        Op::Add(k, d) => {
            let old = sqlite_get(conn, k);
            sqlite_set(conn, k, &add_value(old.as_deref(), *d));
        }
        Op::ByteMax(k, v) => {
            if sqlite_get(conn, k).is_none_or(|old| old < *v) {
                sqlite_set(conn, k, v);
            }
        }
        Op::StampKey(k, v) => {
            sqlite_set(conn, &fill_stamp(k, version, *order), v);
            *order += 1;
        }
        Op::StampValue(k, v) => {
            sqlite_set(conn, k, &fill_stamp(v, version, *order));
            *order += 1;
        }
        Op::Other => {}
    }
}

fn range_bounds<'a>(begin: &'a [u8], end: &'a [u8]) -> (Bound<&'a [u8]>, Bound<&'a [u8]>) {
    (Bound::Included(begin), Bound::Excluded(end))
}

fn lmdb_read(db: &heed::Database<Bytes, Bytes>, txn: &heed::RoTxn, op: &Op) {
    match op {
        Op::Get(k) => {
            db.get(txn, k).unwrap();
        }
        Op::Range { begin, end, limit, reverse } => {
            let limit = if *limit == 0 { usize::MAX } else { *limit };
            let bounds = range_bounds(begin, end);
            if *reverse {
                db.rev_range(txn, &bounds).unwrap().take(limit).for_each(|kv| {
                    kv.unwrap();
                });
            } else {
                db.range(txn, &bounds).unwrap().take(limit).for_each(|kv| {
                    kv.unwrap();
                });
            }
        }
        _ => unreachable!("a write in a read"),
    }
}

fn lmdb_write(db: &heed::Database<Bytes, Bytes>, wtxn: &mut heed::RwTxn, op: &Op, version: u64, order: &mut u16) {
    match op {
        Op::Get(_) | Op::Range { .. } => lmdb_read(db, wtxn, op),
        Op::Set(k, v) => db.put(wtxn, k, v).unwrap(),
        Op::Clear(k) => {
            db.delete(wtxn, k).unwrap();
        }
        Op::ClearRange(b, e) => {
            db.delete_range(wtxn, &range_bounds(b, e)).unwrap();
        }
        Op::Add(k, d) => {
            let new = add_value(db.get(wtxn, k).unwrap(), *d);
            db.put(wtxn, k, &new).unwrap();
        }
        Op::ByteMax(k, v) => {
            if db.get(wtxn, k).unwrap().is_none_or(|old| old < v.as_slice()) {
                db.put(wtxn, k, v).unwrap();
            }
        }
        Op::StampKey(k, v) => {
            db.put(wtxn, &fill_stamp(k, version, *order), v).unwrap();
            *order += 1;
        }
        Op::StampValue(k, v) => {
            db.put(wtxn, k, &fill_stamp(v, version, *order)).unwrap();
            *order += 1;
        }
        Op::Other => {}
    }
}
