//! What one commit of the embedded store costs, on bare SQLite (rusqlite,
//! no store code), with the store's schema and connection settings
//! (`schema.rs`: WAL, synchronous=NORMAL, busy_timeout 0, a
//! `kv(key BLOB PRIMARY KEY, value BLOB) WITHOUT ROWID` table and a `meta`
//! table holding `last_version`), varying what the store could change:
//!
//! * the transaction's shape: one key (the raw commit rate), or the writes
//!   of one `job_add` (a point read of the job key, the pending key, the
//!   job record, the pending count (read + write), the type's `jobs_vs`,
//!   and `meta.last_version` (read + write), as `jobs::ops::add` and the
//!   embedded transaction do);
//! * how many of those share one SQLite transaction (1 = today; 8 = what a
//!   group commit of 8 concurrent callers would do);
//! * `wal_autocheckpoint` (1000 pages = the store's setting, SQLite's
//!   default; 10000) and `page_size` (4096, the default; 1024).
//!
//! ```text
//! cargo run --release -p couch_workers_bench --example cw_sqlite_shapes -- DIR [SECONDS]
//! ```
//!
//! Prints one flat JSON object per configuration: transactions/s,
//! job-adds/s, and WAL frames written per transaction (from
//! `PRAGMA wal_checkpoint` counts is not possible with autocheckpoint on,
//! so frames are counted from the WAL size growth between checkpoints: see
//! `frames_per_tx`).

use std::time::{Duration, Instant};

use rusqlite::{params, Connection, OptionalExtension};

const SQL_SET: &str =
    "INSERT INTO kv(key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value";
const SQL_GET: &str = "SELECT value FROM kv WHERE key = ?1";

fn open(path: &std::path::Path, page_size: u32, autockpt: u32) -> Connection {
    let conn = Connection::open(path).expect("open");
    conn.busy_timeout(Duration::ZERO).unwrap();
    conn.pragma_update(None, "page_size", page_size).unwrap();
    let _: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0)).unwrap();
    conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
    conn.pragma_update(None, "wal_autocheckpoint", autockpt).unwrap();
    conn.pragma_update(None, "journal_size_limit", 64 * 1024 * 1024).unwrap();
    conn.set_prepared_statement_cache_capacity(32);
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
         CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value) WITHOUT ROWID;
         INSERT OR IGNORE INTO meta VALUES ('last_version', 0);",
    )
    .unwrap();
    conn
}

fn key(prefix: &[u8], tail: &[u8]) -> Vec<u8> {
    let mut k = b"\x01couch_workers\x00\x01".to_vec();
    k.extend_from_slice(prefix);
    k.extend_from_slice(b"\x00\x01j\x00\x01");
    k.extend_from_slice(tail);
    k.push(0);
    k
}

fn bump_version(conn: &Connection) {
    let v: i64 = conn
        .prepare_cached("SELECT value FROM meta WHERE name = 'last_version'")
        .unwrap()
        .query_row([], |r| r.get(0))
        .unwrap();
    conn.prepare_cached("UPDATE meta SET value = ?1 WHERE name = 'last_version'").unwrap().execute([v + 1]).unwrap();
}

fn one_key(conn: &Connection, n: u64) {
    conn.prepare_cached(SQL_SET).unwrap().execute(params![key(b"raw", &n.to_be_bytes()), b"value".as_slice()]).unwrap();
}

fn job_add(conn: &Connection, n: u64) {
    let id = format!("job-{n}").into_bytes();
    let jk = key(b"jobs", &id);
    let _: Option<Vec<u8>> = conn.prepare_cached(SQL_GET).unwrap().query_row([&jk], |r| r.get(0)).optional().unwrap();
    let mut pk = key(b"pending", &n.to_be_bytes());
    pk.extend_from_slice(&id);
    conn.prepare_cached(SQL_SET).unwrap().execute(params![pk, b"".as_slice()]).unwrap();
    let record = [b'x'; 90];
    conn.prepare_cached(SQL_SET).unwrap().execute(params![jk, record.as_slice()]).unwrap();
    let ck = key(b"counts", b"pending");
    let c: Option<Vec<u8>> = conn.prepare_cached(SQL_GET).unwrap().query_row([&ck], |r| r.get(0)).optional().unwrap();
    let c = c.map(|v| i64::from_le_bytes(v.try_into().unwrap_or([0; 8]))).unwrap_or(0) + 1;
    conn.prepare_cached(SQL_SET).unwrap().execute(params![ck, c.to_le_bytes().as_slice()]).unwrap();
    conn.prepare_cached(SQL_SET).unwrap().execute(params![key(b"jobs_vs", b""), [7u8; 10].as_slice()]).unwrap();
}

fn wal_frames(path: &std::path::Path, page_size: u32) -> u64 {
    let wal = path.with_extension("sqlite-wal");
    let len = std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0);
    len.saturating_sub(32) / (u64::from(page_size) + 24)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().expect("usage: cw_sqlite_shapes DIR [SECONDS]"));
    let secs: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    std::fs::create_dir_all(&dir).unwrap();
    let configs: &[(&str, usize, u32, u32)] = &[
        ("one_key", 1, 4096, 1000),
        ("job_add", 1, 4096, 1000),
        ("job_add", 8, 4096, 1000),
        ("job_add", 1, 4096, 10000),
        ("job_add", 8, 4096, 10000),
        ("job_add", 1, 1024, 1000),
        ("job_add", 1, 1024, 4000),
    ];
    for (i, &(shape, per_tx, page_size, autockpt)) in configs.iter().enumerate() {
        let path = dir.join(format!("s{i}.sqlite"));
        let conn = open(&path, page_size, autockpt);
        // Frames per transaction: a separate short run with checkpoints
        // off, counting WAL growth.
        conn.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
        let probe = 200u64;
        let mut n = 1_000_000u64;
        for _ in 0..probe {
            conn.execute_batch("BEGIN IMMEDIATE").unwrap();
            bump_version(&conn);
            for _ in 0..per_tx {
                n += 1;
                if shape == "one_key" {
                    one_key(&conn, n)
                } else {
                    job_add(&conn, n)
                }
            }
            conn.execute_batch("COMMIT").unwrap();
        }
        let frames_per_tx = wal_frames(&path, page_size) as f64 / probe as f64;
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
        conn.pragma_update(None, "wal_autocheckpoint", autockpt).unwrap();
        let started = Instant::now();
        let mut txs = 0u64;
        let mut lat = Vec::new();
        while started.elapsed().as_secs_f64() < secs {
            let t = Instant::now();
            conn.execute_batch("BEGIN IMMEDIATE").unwrap();
            bump_version(&conn);
            for _ in 0..per_tx {
                n += 1;
                if shape == "one_key" {
                    one_key(&conn, n)
                } else {
                    job_add(&conn, n)
                }
            }
            conn.execute_batch("COMMIT").unwrap();
            lat.push(t.elapsed().as_micros() as u64);
            txs += 1;
        }
        let s = started.elapsed().as_secs_f64();
        lat.sort_unstable();
        let p = |q: usize| lat[((q * lat.len()).div_ceil(100)).clamp(1, lat.len()) - 1] as f64 / 1000.0;
        println!(
            "{{\"workload\":\"sqlite_shapes\",\"variant\":\"{shape}_x{per_tx}_page{page_size}_ckpt{autockpt}\",\
             \"shape\":\"{shape}\",\"per_tx\":{per_tx},\"page_size\":{page_size},\"wal_autocheckpoint\":{autockpt},\
             \"tx_per_s\":{:.1},\"ops_per_s\":{:.1},\"frames_per_tx\":{frames_per_tx:.2},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"max_ms\":{:.3}}}",
            txs as f64 / s,
            (txs * per_tx as u64) as f64 / s,
            p(50),
            p(99),
            p(100)
        );
        drop(conn);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
