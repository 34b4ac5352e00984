//! LMDB against the store's crash-safety bar, with real child processes
//! killed by SIGKILL:
//!
//! * a writer killed mid-run: every commit it had reported survives and
//!   the environment opens (`kill_writer`);
//! * a reader killed inside its read transaction: its slot in the lock
//!   file stays until `mdb_reader_check` clears it (`stale_reader`);
//! * a writer killed while it holds the write lock: the next writer gets
//!   the lock (LMDB's robust mutexes); while it lives, another process's
//!   `mdb_txn_begin` blocks with no timeout (`dead_lock_holder`);
//! * a full map: MDB_MAP_FULL, and what growing it takes; the longest
//!   key (`map_full`).
//!
//! * a full disk (`disk_full`, run alone on a small file system the caller
//!   mounts: `cw_engine_shapes MOUNT 0 disk-full`).
//!
//! Each prints one JSON line of what it saw; none asserts (a benchmark),
//! the figures go to bench/RESULTS.md.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use heed::types::Bytes;
use heed::{EnvFlags, EnvOpenOptions};

use crate::line;

const COUNTER: &[u8] = b"counter";

fn open_env(dir: &Path, map_size: usize) -> heed::Env {
    std::fs::create_dir_all(dir).unwrap();
    // SAFETY: one open per directory in this process; nothing edits the
    // files behind LMDB's back.
    unsafe { EnvOpenOptions::new().map_size(map_size).flags(EnvFlags::NO_SYNC).open(dir).expect("open lmdb") }
}

fn db_of(env: &heed::Env) -> heed::Database<Bytes, Bytes> {
    let mut wtxn = env.write_txn().unwrap();
    let db = env.create_database(&mut wtxn, None).unwrap();
    wtxn.commit().unwrap();
    db
}

/// The child processes' side: `--crash-child=writer|reader|locker DIR`.
pub fn child(which: &str, dir: &Path) {
    let env = open_env(dir, 1 << 30);
    let db = db_of(&env);
    match which {
        "writer" => {
            for i in 1u64..10_000_000 {
                let mut wtxn = env.write_txn().unwrap();
                db.put(&mut wtxn, COUNTER, &i.to_be_bytes()).unwrap();
                db.put(&mut wtxn, format!("k{i:09}").as_bytes(), &[7u8; 100]).unwrap();
                wtxn.commit().unwrap();
                // Reported only once committed.
                println!("{i}");
            }
        }
        "reader" => {
            let _rtxn = env.read_txn().unwrap();
            println!("ready");
            std::thread::sleep(Duration::from_secs(60));
        }
        "locker" => {
            let mut wtxn = env.write_txn().unwrap();
            db.put(&mut wtxn, b"uncommitted", b"x").unwrap();
            println!("ready");
            std::thread::sleep(Duration::from_secs(60));
        }
        _ => panic!("unknown crash child {which}"),
    }
}

fn spawn(which: &str, dir: &Path) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([format!("--crash-child={which}"), dir.to_str().unwrap().to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

fn kill9(child: &mut Child) {
    // SAFETY: signalling our own child by its pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
}

fn kill_writer(dir: &Path, trial: u64) {
    let (mut child, mut out) = spawn("writer", dir);
    let mut last = 0u64;
    let mut buf = String::new();
    // Let it commit a few thousand times, then kill it mid-stream.
    while last < 2_000 + 997 * trial {
        buf.clear();
        if out.read_line(&mut buf).unwrap() == 0 {
            break;
        }
        last = buf.trim().parse().unwrap();
    }
    kill9(&mut child);
    for l in out.lines() {
        last = l.unwrap().trim().parse().unwrap_or(last);
    }
    child.wait().unwrap();
    let t = Instant::now();
    let env = open_env(dir, 1 << 30);
    let rtxn = env.read_txn().unwrap();
    let db: heed::Database<Bytes, Bytes> = env.open_database(&rtxn, None).unwrap().expect("the database");
    let found = db.get(&rtxn, COUNTER).unwrap().map(|v| u64::from_be_bytes(v.try_into().unwrap())).unwrap_or(0);
    let all_there = (1..=found).all(|i| db.get(&rtxn, format!("k{i:09}").as_bytes()).unwrap().is_some());
    let open_ms = t.elapsed().as_secs_f64() * 1e3;
    drop(rtxn);
    env.prepare_for_closing().wait();
    line(
        "lmdb_kill9_writer",
        &[
            ("trial", trial as f64),
            ("last_reported_commit", last as f64),
            ("counter_after_reopen", found as f64),
            ("reported_commits_lost", last.saturating_sub(found) as f64),
            ("every_key_up_to_counter", all_there as u8 as f64),
            ("reopen_and_check_ms", open_ms),
        ],
    );
}

fn stale_reader(dir: &Path) {
    // This process keeps the environment open, as the other nodes of a
    // host would: a process that opens it alone resets the reader table.
    let env = open_env(dir, 1 << 30);
    let db = db_of(&env);
    let (mut child, mut out) = spawn("reader", dir);
    let mut buf = String::new();
    out.read_line(&mut buf).unwrap();
    kill9(&mut child);
    child.wait().unwrap();
    // What a dead reader costs until it is cleared: its snapshot keeps
    // every page freed after it, so the file grows with each rewrite.
    let grow = |env: &heed::Env| {
        let before = env.real_disk_size().unwrap();
        for i in 0..2000u32 {
            let mut wtxn = env.write_txn().unwrap();
            db.put(&mut wtxn, b"rewritten", &[i as u8; 2000]).unwrap();
            wtxn.commit().unwrap();
        }
        env.real_disk_size().unwrap() - before
    };
    let grown_stale = grow(&env);
    let cleared = env.clear_stale_readers().unwrap();
    let grown_cleared = grow(&env);
    env.prepare_for_closing().wait();
    line(
        "lmdb_kill9_reader",
        &[
            ("cleared_by_reader_check", cleared as f64),
            ("file_growth_2000_rewrites_with_stale_reader_bytes", grown_stale as f64),
            ("file_growth_2000_rewrites_after_check_bytes", grown_cleared as f64),
        ],
    );
}

fn dead_lock_holder(dir: &Path) {
    let (mut child, mut out) = spawn("locker", dir);
    let mut buf = String::new();
    out.read_line(&mut buf).unwrap();
    let env = open_env(dir, 1 << 30);
    let (tx, rx) = mpsc::channel();
    let env2 = env.clone();
    let waiter = std::thread::spawn(move || {
        let t = Instant::now();
        let wtxn = env2.write_txn().unwrap();
        tx.send(t.elapsed()).unwrap();
        let db: heed::Database<Bytes, Bytes> = env2.open_database(&wtxn, None).unwrap().unwrap();
        let uncommitted = db.get(&wtxn, b"uncommitted").unwrap().is_some();
        wtxn.abort();
        uncommitted
    });
    // While the holder lives, the other writer waits (no try-lock, no timeout).
    let blocked = rx.recv_timeout(Duration::from_millis(500)).is_err();
    let t = Instant::now();
    kill9(&mut child);
    child.wait().unwrap();
    let waited = rx.recv_timeout(Duration::from_secs(30));
    let after_kill_ms = t.elapsed().as_secs_f64() * 1e3;
    let saw_uncommitted = waiter.join().unwrap();
    env.prepare_for_closing().wait();
    line(
        "lmdb_kill9_lock_holder",
        &[
            ("other_writer_blocked_500ms_while_holder_lives", blocked as u8 as f64),
            ("other_writer_got_lock", waited.is_ok() as u8 as f64),
            ("lock_after_kill_ms", after_kill_ms),
            ("saw_dead_holders_uncommitted_write", saw_uncommitted as u8 as f64),
        ],
    );
}

fn map_full(dir: &Path) {
    let env = open_env(dir, 1 << 20);
    let db = db_of(&env);
    let mut written = 0u64;
    let err = loop {
        let mut wtxn = env.write_txn().unwrap();
        let r = db.put(&mut wtxn, format!("k{written:09}").as_bytes(), &[1u8; 1000]).and_then(|_| wtxn.commit());
        match r {
            Ok(()) => written += 1,
            Err(e) => break e.to_string(),
        }
    };
    // Growing the map: only with no transaction open in this process;
    // other processes must do the same when their next begin says
    // MDB_MAP_RESIZED.
    // SAFETY: no transaction of this environment is open.
    let resized = unsafe { env.resize(8 << 20) }.is_ok();
    let mut wtxn = env.write_txn().unwrap();
    let after = db.put(&mut wtxn, b"after-resize", &[1u8; 1000]).and_then(|_| wtxn.commit()).is_ok();
    // The store's keys go up to 10,000 bytes (FoundationDB's limit).
    let max_key = env.max_key_size();
    env.prepare_for_closing().wait();
    println!("{{\"workload\":\"engine\",\"variant\":\"lmdb_map_full\",\"values_of_1000_bytes_in_1_mib_map\":{written},\"error\":\"{err}\",\"resized_to_8_mib\":{resized},\"write_after_resize\":{after},\"max_key_size\":{max_key}}}");
}

/// Fills a small file system under LMDB: a commit that cannot write its
/// pages fails; once space is back (a filler file removed) the next
/// commit works, and a reopen finds every commit that was acknowledged.
pub fn disk_full(mount: &Path) {
    let dir = mount.join("lmdb-disk-full");
    let filler = mount.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    std::io::Write::write_all(&mut f, &vec![0u8; 1 << 20]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let env = open_env(&dir, 1 << 30);
    let db = db_of(&env);
    let mut committed = 0u64;
    let err = loop {
        let mut wtxn = env.write_txn().unwrap();
        let r = db
            .put(&mut wtxn, format!("k{committed:09}").as_bytes(), &[3u8; 1000])
            .and_then(|_| db.put(&mut wtxn, COUNTER, &(committed + 1).to_be_bytes()))
            .and_then(|_| wtxn.commit());
        match r {
            Ok(()) => committed += 1,
            Err(e) => break e.to_string(),
        }
        if committed > 1_000_000 {
            break "no error".into();
        }
    };
    std::fs::remove_file(&filler).unwrap();
    let mut wtxn = env.write_txn().unwrap();
    let after = db.put(&mut wtxn, b"after-space-freed", b"x").and_then(|_| wtxn.commit()).is_ok();
    env.prepare_for_closing().wait();
    let env = open_env(&dir, 1 << 30);
    let rtxn = env.read_txn().unwrap();
    let db: heed::Database<Bytes, Bytes> = env.open_database(&rtxn, None).unwrap().expect("the database");
    let counter = db.get(&rtxn, COUNTER).unwrap().map(|v| u64::from_be_bytes(v.try_into().unwrap())).unwrap_or(0);
    let all_there = (0..counter).all(|i| db.get(&rtxn, format!("k{i:09}").as_bytes()).unwrap().is_some());
    drop(rtxn);
    env.prepare_for_closing().wait();
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "{{\"workload\":\"engine\",\"variant\":\"lmdb_disk_full\",\"commits_before_error\":{committed},\"error\":\"{err}\",\"commit_after_space_freed\":{after},\"counter_after_reopen\":{counter},\"every_key_up_to_counter\":{all_there}}}"
    );
}

pub fn run_all(dir: &Path) {
    for trial in 0..3 {
        let d = dir.join(format!("crash-writer-{trial}"));
        kill_writer(&d, trial);
        let _ = std::fs::remove_dir_all(&d);
    }
    for (name, f) in
        [("crash-reader", stale_reader as fn(&Path)), ("crash-locker", dead_lock_holder), ("map-full", map_full)]
    {
        let d = dir.join(name);
        f(&d);
        let _ = std::fs::remove_dir_all(&d);
    }
}
