//! Runs again, on bare SQLite, the statements that the embedded store's
//! write connection ran (a trace written by a build with the feature
//! `sql-trace`, see `store/embedded/sql_trace.rs`), as fast as one thread
//! can: SQLite's own time for exactly that work, with no store code, no
//! runtime and no Erlang around it. Every write of the store goes through
//! its one write connection, and SQLite lets one writer in at a time on the
//! whole host, so this time is a ceiling for any workload the trace
//! recorded: no build of the store on this engine, key space and
//! durability runs it faster.
//!
//! Each statement is run as the store runs it: prepared once (cached) and
//! executed with its values bound (the blobs, integers and `zeroblob`s of
//! the expanded SQL become parameters), every row of a read stepped
//! through. The database starts empty, with the store's schema and
//! settings (1 KiB pages, WAL, `synchronous=NORMAL`, no checkpoint inside
//! a commit: the store runs them on another thread).
//!
//! ```text
//! cw_sqlite_replay TRACE DIR
//! ```
//!
//! Prints one JSON line: statements, transactions (`BEGIN`s), seconds,
//! statements per second. `bench/sqlite_replay.sh` records the traces of a
//! J2 and of its fill alone, replays both and prints the drain's time per
//! job.

use std::time::Instant;

use rusqlite::types::Value;
use rusqlite::Connection;

/// One statement of the trace: its text with `?` for every value, and the
/// values.
struct Step {
    sql: usize,
    values: Vec<Value>,
}

/// Splits expanded SQL into a parameterised text and its values: `x'..'`
/// blobs, `zeroblob(N)` and integer literals outside quotes.
fn parameterise(line: &str) -> (String, Vec<Value>) {
    let b = line.as_bytes();
    let mut sql = String::with_capacity(line.len());
    let mut values = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'x' && b.get(i + 1) == Some(&b'\'') && (i == 0 || !b[i - 1].is_ascii_alphanumeric()) {
            let end = line[i + 2..].find('\'').map(|e| i + 2 + e).expect("a closed blob literal");
            values.push(Value::Blob(hex(&line[i + 2..end])));
            sql.push('?');
            i = end + 1;
        } else if line[i..].starts_with("zeroblob(") {
            let end = line[i..].find(')').map(|e| i + e).expect("a closed zeroblob");
            let n: usize = line[i + 9..end].parse().expect("zeroblob's length");
            values.push(Value::Blob(vec![0; n]));
            sql.push('?');
            i = end + 1;
        } else if b[i] == b'\'' {
            // A string literal: copied as it is (names such as 'last_version').
            let end = line[i + 1..].find('\'').map(|e| i + 1 + e).expect("a closed string literal");
            sql.push_str(&line[i..=end]);
            i = end + 1;
        } else if (b[i].is_ascii_digit() || (b[i] == b'-' && b.get(i + 1).is_some_and(u8::is_ascii_digit)))
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
        {
            let mut end = i + 1;
            while end < b.len() && b[end].is_ascii_digit() {
                end += 1;
            }
            values.push(Value::Integer(line[i..end].parse().expect("an integer literal")));
            sql.push('?');
            i = end;
        } else {
            let c = line[i..].chars().next().expect("a character");
            sql.push(c);
            i += c.len_utf8();
        }
    }
    (sql, values)
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex digits")).collect()
}

fn open(path: &std::path::Path) -> Connection {
    let conn = Connection::open(path).expect("open");
    // The store's page size for new files (schema.rs), set before WAL.
    conn.pragma_update(None, "page_size", 1024).expect("page_size");
    let _: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0)).expect("WAL");
    conn.pragma_update(None, "synchronous", "NORMAL").expect("synchronous");
    conn.pragma_update(None, "wal_autocheckpoint", 0).expect("wal_autocheckpoint");
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true).expect("QPSG");
    conn.set_prepared_statement_cache_capacity(64);
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
         CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value) WITHOUT ROWID;
         INSERT OR IGNORE INTO meta VALUES ('last_version', 0);",
    )
    .expect("schema");
    conn
}

/// One replay of a parsed trace: seconds, and per distinct statement its
/// count and nanoseconds.
struct Replay {
    seconds: f64,
    spent: Vec<(u64, u128)>,
}

struct Trace {
    texts: Vec<String>,
    steps: Vec<Step>,
}

impl Trace {
    fn read(path: &str) -> Trace {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
        let mut texts: Vec<String> = Vec::new();
        let mut index = std::collections::HashMap::new();
        let mut steps = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let (sql, values) = parameterise(line);
            let next = texts.len();
            let sql = *index.entry(sql.clone()).or_insert_with(|| {
                texts.push(sql);
                next
            });
            steps.push(Step { sql, values });
        }
        Trace { texts, steps }
    }

    fn count(&self, prefix: &str) -> usize {
        self.steps.iter().filter(|s| self.texts[s.sql].starts_with(prefix)).count()
    }

    /// Replays the trace; with `per_commit`, its store transactions (its
    /// `BEGIN IMMEDIATE`s and the `SAVEPOINT`s of the writers that joined
    /// a group commit) are regrouped so that one SQLite commit holds that
    /// many of them, as a group commit of that size would.
    fn replay(&self, dir: &std::path::Path, per_commit: Option<usize>) -> Replay {
        let path = dir.join("replay.sqlite");
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        let conn = open(&path);
        // Time per distinct statement (two clock reads a statement, ~50 ns,
        // inside the total).
        let mut spent = vec![(0u64, 0u128); self.texts.len()];
        let (mut open_tx, mut in_group) = (false, 0usize);
        let started = Instant::now();
        for step in &self.steps {
            let t = Instant::now();
            if let Some(k) = per_commit {
                let sql = self.texts[step.sql].as_str();
                if sql.starts_with("BEGIN") || sql.starts_with("SAVEPOINT") {
                    in_group += 1;
                }
                if sql.starts_with("BEGIN") {
                    if open_tx {
                        continue;
                    }
                    open_tx = true;
                } else if sql == "COMMIT" {
                    if in_group < k {
                        continue;
                    }
                    (open_tx, in_group) = (false, 0);
                }
            }
            let mut stmt = conn.prepare_cached(&self.texts[step.sql]).expect("prepare a traced statement");
            for (i, v) in step.values.iter().enumerate() {
                stmt.raw_bind_parameter(i + 1, v).expect("bind");
            }
            if stmt.readonly() {
                let mut rows = stmt.raw_query();
                while rows.next().expect("step a read").is_some() {}
            } else {
                stmt.raw_execute().expect("run a traced write");
            }
            drop(stmt);
            let slot = &mut spent[step.sql];
            slot.0 += 1;
            slot.1 += t.elapsed().as_nanos();
        }
        if open_tx {
            conn.execute_batch("COMMIT").expect("the last regrouped commit");
        }
        let seconds = started.elapsed().as_secs_f64();
        drop(conn);
        Replay { seconds, spent }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The time a statement text took per job: the trace's minus the base's.
fn per_job_us(sql: &str, trace: &Trace, runs: &[Replay], base: Option<(&Trace, &[Replay])>, jobs: f64) -> f64 {
    let ns = |t: &Trace, rs: &[Replay]| {
        t.texts.iter().position(|x| x == sql).map_or(0.0, |i| median(rs.iter().map(|r| r.spent[i].1 as f64).collect()))
    };
    let minus = base.map_or(0.0, |(t, rs)| ns(t, rs));
    (ns(trace, runs) - minus) / 1000.0 / jobs
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut args: Vec<String> = args;
    let per_commit = match args.iter().position(|a| a == "--per-commit") {
        Some(i) if i + 1 < args.len() => {
            let k = args[i + 1].parse().expect("--per-commit: a positive number");
            args.drain(i..i + 2);
            Some(k).filter(|&k: &usize| k > 0)
        }
        _ => None,
    };
    if args.len() < 3 || args.len() > 4 {
        eprintln!("usage: cw_sqlite_replay [--per-commit K] DIR JOBS TRACE [BASE_TRACE]");
        std::process::exit(2);
    }
    let dir = std::path::PathBuf::from(&args[0]);
    let jobs: f64 = args[1].parse().expect("JOBS: a number");
    std::fs::create_dir_all(&dir).expect("the replay's directory");
    let trace = Trace::read(&args[2]);
    let base = args.get(3).map(|p| Trace::read(p));
    const REPS: usize = 3;
    let (mut runs, mut base_runs) = (Vec::new(), Vec::new());
    // Alternating, so that the machine's noise falls on both.
    for _ in 0..REPS {
        runs.push(trace.replay(&dir, per_commit));
        if let Some(b) = &base {
            base_runs.push(b.replay(&dir, per_commit));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let secs = median(runs.iter().map(|r| r.seconds).collect());
    let base_secs = if base.is_some() { median(base_runs.iter().map(|r| r.seconds).collect()) } else { 0.0 };
    let commits = |t: &Trace| match per_commit {
        None => t.count("COMMIT"),
        Some(k) => (t.count("BEGIN") + t.count("SAVEPOINT")).div_ceil(k),
    };
    let less = |f: &dyn Fn(&Trace) -> usize| f(&trace) as f64 - base.as_ref().map_or(0.0, |b| f(b) as f64);
    let us_per_job = (secs - base_secs) * 1e6 / jobs;
    // By kind of statement, flat (bench/run reads flat JSON objects).
    let mut by =
        [("commit", 0.0), ("set", 0.0), ("get", 0.0), ("clear", 0.0), ("range", 0.0), ("begin", 0.0), ("other", 0.0)];
    for sql in &trace.texts {
        let kind = match sql.as_str() {
            "COMMIT" => "commit",
            s if s.starts_with("INSERT INTO kv") => "set",
            s if s.starts_with("SELECT value FROM kv") => "get",
            s if s.starts_with("DELETE FROM kv WHERE key = ?") => "clear",
            s if s.starts_with("SELECT key, value FROM kv") => "range",
            s if s.starts_with("BEGIN") => "begin",
            _ => "other",
        };
        let us = per_job_us(sql, &trace, &runs, base.as_ref().map(|b| (b, base_runs.as_slice())), jobs);
        if let Some(slot) = by.iter_mut().find(|(k, _)| *k == kind) {
            slot.1 += us;
        }
    }
    let by: Vec<String> = by.iter().map(|(k, us)| format!("\"{k}_us_per_job\":{us:.2}")).collect();
    println!(
        "{{\"workload\":\"sqlite_replay\",\"variant\":\"{}\",\"jobs\":{jobs},\"reps\":{REPS},\"seconds\":{secs:.4},\
         \"base_seconds\":{base_secs:.4},\"statements_per_job\":{:.2},\"commits_per_job\":{:.3},\
         \"sqlite_us_per_job\":{us_per_job:.2},\"ceiling_jobs_per_s\":{:.0},{}}}",
        per_commit.map_or("as_recorded".to_string(), |k| format!("{k}_per_commit")),
        less(&|t| t.steps.len()) / jobs,
        less(&commits) / jobs,
        1e6 / us_per_job,
        by.join(",")
    );
}
