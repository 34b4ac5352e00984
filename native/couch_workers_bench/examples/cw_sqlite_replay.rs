//! Runs again, on bare SQLite, the statements that the embedded store's
//! write connection ran (a trace written by a build with the feature
//! `sql-trace`, see `store/embedded/sql_trace.rs`), as fast as one thread
//! can: SQLite's own time for that work, with no store code, no runtime
//! and no Erlang around it. SQLite lets one writer at a time into a
//! database on the whole host, and every write transaction of the store
//! runs on its write connection (a read-mode transaction that upgrades
//! itself to a writer runs on a pooled connection and is not traced; no
//! job operation does that), so this time is a ceiling for the workload
//! the trace recorded: no build of the store runs it faster on this
//! engine, key space and durability.
//!
//! Each statement is prepared once (cached, as the store does) and run
//! with its values bound: the blobs, integers and `zeroblob`s of the
//! expanded SQL become parameters; every row of a read is stepped
//! through. The database starts empty, with the store's schema and
//! settings (1 KiB pages, WAL, `synchronous=NORMAL`, no checkpoint inside
//! a commit). The store checkpoints on another thread and keeps its WAL
//! short; the replay does the same between statements, with its clock
//! stopped, once the WAL passes the store's restart mark.
//!
//! ```text
//! cw_sqlite_replay [--per-commit K] DIR JOBS TRACE [BASE_TRACE]
//! ```
//!
//! Replays TRACE (and BASE_TRACE, alternating, 3 reps each) in DIR and
//! prints one JSON line: SQLite's time per job of TRACE less BASE_TRACE
//! (a J2 and its fill alone: the drain), divided by JOBS, by kind of
//! statement, the statements and commits per job that ran, and the rate
//! that time allows. With `--per-commit K` the store transactions of the
//! traces (each `BEGIN IMMEDIATE`, and each `SAVEPOINT` of a writer that
//! joined a group commit) are regrouped K to a SQLite commit, as a group
//! commit of K writers would hold them: the trace's own commits are
//! dropped. The store's version bump (`meta.last_version`) still runs as
//! recorded, once per recorded commit.

use std::time::{Duration, Instant};

use rusqlite::types::Value;
use rusqlite::Connection;

/// The WAL length (frames) past which the store's checkpoint thread
/// restarts the log (`checkpoint.rs`'s `RESTART_AT`).
const RESTART_AT_FRAMES: u64 = 4_000;
const PAGE_SIZE: u64 = 1024;
const REPS: usize = 3;

/// One statement of the trace: its text with `?` for every value, and the
/// values.
struct Step {
    sql: usize,
    values: Vec<Value>,
}

/// Splits one line of expanded SQL into a parameterised text and its
/// values: `x'..'` blobs, `zeroblob(N)` and integer literals outside
/// quotes (all the store binds). Anything else that looks like a value (a
/// real number) is refused: the replay would not be the store's work.
fn parameterise(line: &str) -> Result<(String, Vec<Value>), String> {
    let b = line.as_bytes();
    let word = |i: usize| i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
    let mut sql = String::with_capacity(line.len());
    let mut values = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'x' && b.get(i + 1) == Some(&b'\'') && !word(i) {
            let end = line[i + 2..].find('\'').map(|e| i + 2 + e).ok_or("an unclosed blob literal")?;
            values.push(Value::Blob(hex(&line[i + 2..end])?));
            sql.push('?');
            i = end + 1;
        } else if line[i..].starts_with("zeroblob(") && !word(i) {
            let end = line[i..].find(')').map(|e| i + e).ok_or("an unclosed zeroblob")?;
            let n: usize = line[i + 9..end].parse().map_err(|_| "a zeroblob without a length")?;
            values.push(Value::Blob(vec![0; n]));
            sql.push('?');
            i = end + 1;
        } else if b[i] == b'\'' {
            // A string literal, copied as it is (names such as
            // 'last_version'); a doubled quote inside it is two literals
            // side by side, copied alike.
            let end = line[i + 1..].find('\'').map(|e| i + 1 + e).ok_or("an unclosed string literal")?;
            sql.push_str(&line[i..=end]);
            i = end + 1;
        } else if !word(i) && (b[i].is_ascii_digit() || (b[i] == b'-' && b.get(i + 1).is_some_and(u8::is_ascii_digit)))
        {
            let mut end = i + 1;
            while end < b.len() && b[end].is_ascii_digit() {
                end += 1;
            }
            if matches!(b.get(end), Some(b'.' | b'e' | b'E')) {
                return Err(format!("a real number at {i}: only blobs and integers are replayed"));
            }
            values.push(Value::Integer(line[i..end].parse().map_err(|_| "an integer out of range")?));
            sql.push('?');
            i = end;
        } else {
            let c = line[i..].chars().next().ok_or("a cut character")?;
            sql.push(c);
            i += c.len_utf8();
        }
    }
    Ok((sql, values))
}

fn hex(s: &str) -> Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) {
        return Err("a blob literal of an odd number of hex digits".into());
    }
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())).collect()
}

fn open(path: &std::path::Path) -> Connection {
    let conn = Connection::open(path).expect("open");
    // The store's settings (schema.rs): its page size for new files, set
    // before WAL.
    conn.pragma_update(None, "page_size", PAGE_SIZE as i64).expect("page_size");
    let _: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0)).expect("WAL");
    conn.pragma_update(None, "synchronous", "NORMAL").expect("synchronous");
    conn.pragma_update(None, "wal_autocheckpoint", 0).expect("wal_autocheckpoint");
    conn.pragma_update(None, "journal_size_limit", 64 * 1024 * 1024).expect("journal_size_limit");
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true).expect("QPSG");
    conn.set_prepared_statement_cache_capacity(32);
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
         CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value) WITHOUT ROWID;
         INSERT OR IGNORE INTO meta VALUES ('last_version', 0);",
    )
    .expect("schema");
    conn
}

/// The kinds of statement the time is told by.
const KINDS: [&str; 7] = ["commit", "set", "get", "clear", "range", "begin", "other"];

fn kind(sql: &str) -> usize {
    let k = match sql {
        "COMMIT" => "commit",
        s if s.starts_with("INSERT INTO kv") => "set",
        s if s.starts_with("SELECT value FROM kv") => "get",
        s if s.starts_with("DELETE FROM kv WHERE key = ?") => "clear",
        s if s.starts_with("SELECT key, value FROM kv") => "range",
        s if s.starts_with("BEGIN") => "begin",
        _ => "other",
    };
    KINDS.iter().position(|x| *x == k).unwrap_or(KINDS.len() - 1)
}

/// One replay: the time of its statements (checkpoints left out) by kind,
/// and what ran.
#[derive(Default)]
struct Replay {
    by_kind: [Duration; KINDS.len()],
    statements: u64,
    commits: u64,
}

impl Replay {
    fn seconds(&self) -> f64 {
        self.by_kind.iter().sum::<Duration>().as_secs_f64()
    }
}

struct Trace {
    texts: Vec<String>,
    steps: Vec<Step>,
}

impl Trace {
    fn read(path: &str) -> Result<Trace, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
        let mut texts: Vec<String> = Vec::new();
        let mut index = std::collections::HashMap::new();
        let mut steps = Vec::new();
        for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            if line.starts_with("--") {
                return Err(format!("{path}:{}: a statement the trace could not expand: {line}", n + 1));
            }
            let (sql, values) = parameterise(line).map_err(|e| format!("{path}:{}: {e}", n + 1))?;
            let next = texts.len();
            let sql = *index.entry(sql.clone()).or_insert_with(|| {
                texts.push(sql);
                next
            });
            steps.push(Step { sql, values });
        }
        Ok(Trace { texts, steps })
    }

    /// Replays the trace in `dir`; with `per_commit`, regrouped (see the
    /// module doc).
    fn replay(&self, dir: &std::path::Path, per_commit: Option<usize>) -> Replay {
        let path = dir.join("replay.sqlite");
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        let wal = dir.join("replay.sqlite-wal");
        let conn = open(&path);
        let mut out = Replay::default();
        let run = |sql: &str, values: &[Value], out: &mut Replay| {
            let t = Instant::now();
            let mut stmt = conn.prepare_cached(sql).expect("prepare a traced statement");
            for (i, v) in values.iter().enumerate() {
                stmt.raw_bind_parameter(i + 1, v).expect("bind");
            }
            if stmt.readonly() {
                let mut rows = stmt.raw_query();
                while rows.next().expect("step a read").is_some() {}
            } else {
                stmt.raw_execute().expect("run a traced write");
            }
            drop(stmt);
            out.by_kind[kind(sql)] += t.elapsed();
            out.statements += 1;
            if sql == "COMMIT" {
                out.commits += 1;
                // The store's checkpoint thread, clock stopped.
                let frames = std::fs::metadata(&wal).map_or(0, |m| m.len().saturating_sub(32) / (PAGE_SIZE + 24));
                if frames > RESTART_AT_FRAMES {
                    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").expect("checkpoint");
                }
            }
        };
        // Store transactions in the SQLite transaction open now (regrouped
        // replay only).
        let mut in_group: Option<usize> = None;
        for step in &self.steps {
            let sql = self.texts[step.sql].as_str();
            if let Some(k) = per_commit {
                let starts = sql == "BEGIN IMMEDIATE" || sql == "SAVEPOINT cw";
                if starts {
                    // Between two store transactions no savepoint is open
                    // (the last one was released): the group may end here.
                    match in_group {
                        Some(n) if n >= k => {
                            run("COMMIT", &[], &mut out);
                            run("BEGIN IMMEDIATE", &[], &mut out);
                            in_group = Some(1);
                        }
                        Some(n) => in_group = Some(n + 1),
                        None => {
                            run("BEGIN IMMEDIATE", &[], &mut out);
                            in_group = Some(1);
                        }
                    }
                }
                if sql == "BEGIN IMMEDIATE" || sql == "COMMIT" {
                    continue;
                }
            }
            run(sql, &step.values, &mut out);
        }
        if in_group.is_some() {
            run("COMMIT", &[], &mut out);
        }
        drop(conn);
        out
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn usage(why: &str) -> ! {
    eprintln!("cw_sqlite_replay: {why}\nusage: cw_sqlite_replay [--per-commit K] DIR JOBS TRACE [BASE_TRACE]");
    std::process::exit(2);
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let per_commit = match args.iter().position(|a| a == "--per-commit") {
        Some(i) => {
            let k = args.get(i + 1).and_then(|k| k.parse::<usize>().ok()).filter(|&k| k > 0);
            let k = k.unwrap_or_else(|| usage("--per-commit takes a positive number"));
            args.drain(i..i + 2);
            Some(k)
        }
        None => None,
    };
    if args.len() < 3 || args.len() > 4 {
        usage("wrong number of arguments");
    }
    let dir = std::path::PathBuf::from(&args[0]);
    let jobs: f64 = args[1].parse().ok().filter(|&j: &f64| j > 0.0).unwrap_or_else(|| usage("JOBS: a positive number"));
    let read = |p: &String| Trace::read(p).unwrap_or_else(|e| usage(&e));
    let trace = read(&args[2]);
    let base = args.get(3).map(read);
    if per_commit.is_some() {
        // A whole recorded ROLLBACK would undo the merged group with it.
        for t in std::iter::once(&trace).chain(base.as_ref()) {
            if t.texts.iter().any(|s| s == "ROLLBACK") {
                usage("a trace with a ROLLBACK cannot be regrouped (--per-commit); replay it as recorded");
            }
        }
    }
    std::fs::create_dir_all(&dir).expect("the replay's directory");
    let (mut runs, mut base_runs) = (Vec::new(), Vec::new());
    // Alternating, so that the machine's noise falls on both.
    for _ in 0..REPS {
        runs.push(trace.replay(&dir, per_commit));
        if let Some(b) = &base {
            base_runs.push(b.replay(&dir, per_commit));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let med = |rs: &[Replay], f: &dyn Fn(&Replay) -> f64| {
        if rs.is_empty() {
            0.0
        } else {
            median(rs.iter().map(f).collect())
        }
    };
    let drain = |f: &dyn Fn(&Replay) -> f64| (med(&runs, f) - med(&base_runs, f)) / jobs;
    let us_per_job = drain(&|r| r.seconds()) * 1e6;
    let by: Vec<String> = KINDS
        .iter()
        .enumerate()
        .map(|(i, k)| format!("\"{k}_us_per_job\":{:.2}", drain(&|r| r.by_kind[i].as_secs_f64()) * 1e6))
        .collect();
    let ceiling = if us_per_job > 0.0 { format!("{:.0}", 1e6 / us_per_job) } else { "null".into() };
    println!(
        "{{\"workload\":\"sqlite_replay\",\"variant\":\"{}\",\"jobs\":{jobs},\"reps\":{REPS},\"seconds\":{:.4},\
         \"base_seconds\":{:.4},\"statements_per_job\":{:.2},\"commits_per_job\":{:.3},\
         \"sqlite_us_per_job\":{us_per_job:.2},\"ceiling_jobs_per_s\":{ceiling},{}}}",
        per_commit.map_or("as_recorded".to_string(), |k| format!("{k}_per_commit")),
        med(&runs, &|r| r.seconds()),
        med(&base_runs, &|r| r.seconds()),
        drain(&|r| r.statements as f64),
        drain(&|r| r.commits as f64),
        by.join(",")
    );
}
