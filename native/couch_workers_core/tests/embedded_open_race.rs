//! Several processes opening a store nobody has open, at the same moment
//! (Erlang nodes of one host started together). Seen on 1 Dec 2026: one
//! such open in 17 failed with `cannot configure …: database is locked`,
//! because the new connection's settings were applied with no busy
//! timeout while another process held the fresh file's lock (switching it
//! to WAL, creating the tables). Every opener must succeed, and the file's
//! first-time setup (tables, format, clock) must come out exactly once.
//!
//! Each round: a fresh directory, `CHILDREN` child processes (this test
//! binary re-executed) that each say they are ready, then wait for a `go`
//! file and open the store at once, write their key, and exit.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore, FILE_NAME};
use couch_workers_core::store::{run, Database, TxOptions};

mod child_common;

const ROLE: &str = "CW_OPEN_RACE_ROLE";
const DIR: &str = "CW_OPEN_RACE_DIR";
const ID: &str = "CW_OPEN_RACE_ID";
/// Rounds of the test (default `ROUNDS`); raise it to hunt the race.
const ROUNDS_ENV: &str = "CW_OPEN_RACE_ROUNDS";
const ROUNDS: usize = 12;
const CHILDREN: usize = 4;
const TEST: &str = "processes_opening_a_fresh_store_at_once_all_succeed";

fn go_file(dir: &Path) -> PathBuf {
    dir.join("go")
}

fn ready_file(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("ready-{id}"))
}

/// The child: ready, wait for the go, open, write, close.
async fn child(dir: &Path, id: &str) {
    let store_dir = dir.join("store");
    std::fs::write(ready_file(dir, id), b"").expect("ready file");
    let started = Instant::now();
    while !go_file(dir).exists() {
        assert!(started.elapsed() < Duration::from_secs(60), "child {id}: no go");
        std::thread::sleep(Duration::from_micros(200));
    }
    let db = match EmbeddedStore::open(EmbeddedOptions::new(&store_dir)) {
        Ok(db) => db,
        Err(e) => panic!("child {id}: open failed: {e}"),
    };
    let key = format!("opened/{id}").into_bytes();
    run(&*db, TxOptions::write(), |tx| {
        let key = key.clone();
        async move {
            tx.set(&key, b"1");
            Ok(())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("child {id}: write failed: {e}"));
    db.close();
}

/// One round; `Err` carries the failed children's output.
fn round(dir: &Path) -> Result<(), String> {
    let children: Vec<(String, Child)> = (0..CHILDREN)
        .map(|i| {
            let id = i.to_string();
            let child =
                child_common::spawn(TEST, &[(ROLE, "child".as_ref()), (DIR, dir.as_os_str()), (ID, id.as_ref())]);
            (id, child)
        })
        .collect();
    // The go once every child waits for it: they all open at once.
    let started = Instant::now();
    while !(0..CHILDREN).all(|i| ready_file(dir, &i.to_string()).exists()) {
        assert!(started.elapsed() < Duration::from_secs(60), "children not ready");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::fs::write(go_file(dir), b"").expect("go file");
    let mut failures = Vec::new();
    for (id, child) in children {
        let out = child.wait_with_output().expect("child output");
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || !stdout.contains("1 passed") {
            failures.push(format!("child {id}: {:?}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr)));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

/// The first-time setup came out once: both tables, one format row of
/// format 1, and every child's write.
async fn check_store(dir: &Path) {
    let store_dir = dir.join("store");
    {
        let conn = rusqlite::Connection::open_with_flags(
            store_dir.join(FILE_NAME),
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .expect("read the file");
        let tables: i64 = conn
            .query_row("SELECT count(*) FROM sqlite_master WHERE type = 'table'", [], |r| r.get(0))
            .expect("tables");
        assert_eq!(tables, 2, "kv and meta, created once");
        let formats: Vec<i64> = conn
            .prepare("SELECT value FROM meta WHERE name = 'format'")
            .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
            .expect("format");
        assert_eq!(formats, vec![1], "one format row");
        let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).expect("journal mode");
        assert_eq!(mode.to_ascii_lowercase(), "wal");
    }
    let db = EmbeddedStore::open(EmbeddedOptions::new(&store_dir)).expect("open after the race");
    for i in 0..CHILDREN {
        let key = format!("opened/{i}").into_bytes();
        let got = run(&*db, TxOptions::read(), |tx| {
            let key = key.clone();
            async move { tx.get(&key, false).await }
        })
        .await
        .expect("read");
        assert_eq!(got, Some(b"1".to_vec()), "child {i}'s write");
    }
    db.close();
}

#[tokio::test(flavor = "current_thread")]
async fn processes_opening_a_fresh_store_at_once_all_succeed() {
    if std::env::var(ROLE).as_deref() == Ok("child") {
        let dir = PathBuf::from(std::env::var_os(DIR).expect("dir"));
        let id = std::env::var(ID).expect("id");
        child(&dir, &id).await;
        return;
    }
    let rounds = std::env::var(ROUNDS_ENV).ok().and_then(|s| s.parse().ok()).unwrap_or(ROUNDS);
    let mut failed = Vec::new();
    for r in 0..rounds {
        let dir = tempfile::tempdir().expect("dir");
        match round(dir.path()) {
            Ok(()) => check_store(dir.path()).await,
            Err(e) => failed.push((r, e)),
        }
    }
    let first = failed.first().map(|(r, e)| format!("round {r}:\n{e}")).unwrap_or_default();
    assert!(failed.is_empty(), "{} of {rounds} rounds had a failed open\n{first}", failed.len());
}
