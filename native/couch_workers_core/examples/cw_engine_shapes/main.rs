//! Is SQLite the bound of J2? J2's per-job storage shape (one accept round
//! taking one job, and its finish), recorded from a real run of the core
//! on the embedded store, replayed on three engines:
//!
//! * `embedded`: the embedded store's own `Transaction` API (its writer
//!   lock, group commit, versions, watches' bookkeeping, checkpoint thread);
//! * `sqlite`: bare SQLite (rusqlite) with the store's schema and
//!   settings (WAL, synchronous=NORMAL, 1 KiB pages, a `meta` version row
//!   read and written per commit, an in-process writer lock), SQLite's
//!   own automatic checkpoint instead of the store's thread;
//! * `lmdb_nosync` / `lmdb_nometasync`: LMDB through heed, one unnamed
//!   database, a version key read and written per write transaction.
//!
//! with 1 and 8 writer threads (tasks on the embedded store's 2-thread
//! runtime), 2 processes sharing the store, and on the bare engines k
//! writing transactions per commit (what the embedded store's group
//! commit does when k writers queue). Then LMDB's crash checks
//! (`crash.rs`). Figures: bench/RESULTS.md, "SQLite against LMDB on J2's
//! storage shape".
//!
//! ```text
//! cargo run --release -p couch_workers_core --example cw_engine_shapes -- DIR [JOBS] [ONLY]
//! ```
//!
//! `ONLY`: `shape` (print the recorded shape), `runs`, an engine's name
//! (`embedded`, `sqlite`, `lmdb_nosync`, `lmdb_nometasync`: its runs), `crash`,
//! or `disk-full` (DIR: a small file system mounted for it; `crash.rs`). Prints
//! one flat JSON object per figure. DIR is removed at the end.

mod crash;
mod engines;
mod record;
mod shape;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use engines::{Engine, Kind};
use shape::{Op, Shape};

fn line(variant: &str, fields: &[(&str, f64)]) {
    let mut s = format!("{{\"workload\":\"engine\",\"variant\":\"{variant}\"");
    for (k, v) in fields {
        s.push_str(&format!(",\"{k}\":{v:.3}"));
    }
    s.push('}');
    println!("{s}");
}

/// CPU of this process (all threads), µs.
fn cpu_us() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Bytes this process passed to write system calls (`wchar`: WAL frames
/// for SQLite, pages for LMDB, whether or not they reached the disk yet).
fn wchar() -> f64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    io.lines().find_map(|l| l.strip_prefix("wchar: ")).and_then(|v| v.trim().parse().ok()).unwrap_or(0.0)
}

fn now_us() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as f64
}

/// What one process measured over its part of a run.
#[derive(Default, Clone, Copy)]
struct Measured {
    start_us: f64,
    end_us: f64,
    cpu_us: f64,
    wchar: f64,
    commits: f64,
    jobs: f64,
    writer_held_us: f64,
}

fn measure(engine: &Engine, shape: &Shape, jobs: &[u64], threads: usize, group: usize) -> Measured {
    let (c0, w0, t0) = (cpu_us(), wchar(), now_us());
    engines::WRITER_HELD_NS.store(0, Ordering::Relaxed);
    let commits = engine.run(shape, jobs, threads, group);
    Measured {
        start_us: t0,
        end_us: now_us(),
        cpu_us: cpu_us() - c0,
        wchar: wchar() - w0,
        commits: commits as f64,
        jobs: jobs.len() as f64,
        writer_held_us: engines::WRITER_HELD_NS.load(Ordering::Relaxed) as f64 / 1e3,
    }
}

thread_local! {
    /// `ONLY` named an engine: run only its configurations.
    static ONLY_KIND: std::cell::Cell<Option<Kind>> = const { std::cell::Cell::new(None) };
}

fn report(kind: Kind, variant: &str, group: usize, m: &[Measured]) {
    let start = m.iter().map(|x| x.start_us).fold(f64::MAX, f64::min);
    let end = m.iter().map(|x| x.end_us).fold(0.0, f64::max);
    let sum = |f: fn(&Measured) -> f64| m.iter().map(f).sum::<f64>();
    let jobs = sum(|x| x.jobs);
    let wall = end - start;
    line(
        &format!("{}_{variant}", kind.name()),
        &[
            ("tx_per_commit", group as f64),
            ("jobs", jobs),
            ("jobs_per_s", jobs / (wall / 1e6)),
            ("wall_us_per_job", wall / jobs),
            ("cpu_us_per_job", sum(|x| x.cpu_us) / jobs),
            ("commits_per_job", sum(|x| x.commits) / jobs),
            ("bytes_written_per_job", sum(|x| x.wchar) / jobs),
            // Not measured on the embedded store (its lock is inside it);
            // with more threads than cores it includes time a holder was
            // preempted, also just after it let go: read it at 1 thread.
            ("writer_held_us_per_job", sum(|x| x.writer_held_us) / jobs),
            ("sqlite_busy_in_this_process", engines::SQLITE_BUSY.swap(0, Ordering::Relaxed) as f64),
        ],
    );
}

fn shape_file(dir: &Path) -> PathBuf {
    dir.join("shape.bin")
}

/// One configuration: a fresh store, filled, then the jobs on `threads`
/// threads of this process or on `procs` child processes.
fn run_one(dir: &Path, shape: &Shape, kind: Kind, jobs: u64, threads: usize, procs: usize, group: usize) {
    if ONLY_KIND.with(|k| k.get().is_some_and(|k| k != kind)) {
        return;
    }
    let store = dir.join(format!("{}-t{threads}-p{procs}-k{group}", kind.name()));
    let engine = Engine::open(kind, &store);
    engine.fill(shape, jobs);
    let all: Vec<u64> = (0..jobs).collect();
    if procs <= 1 {
        let m = measure(&engine, shape, &all, threads, group);
        report(kind, &format!("threads{threads}"), group, &[m]);
        engine.close();
    } else {
        // The children open the store themselves: this process lets go of
        // it first (heed refuses a second open of one environment).
        engine.close();
        let exe = std::env::current_exe().unwrap();
        let children: Vec<_> = (0..procs)
            .map(|p| {
                Command::new(&exe)
                    .args(["--child", kind.name(), store.to_str().unwrap(), shape_file(dir).to_str().unwrap()])
                    .args([p.to_string(), procs.to_string(), jobs.to_string(), group.to_string()])
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("spawn a child")
            })
            .collect();
        let m: Vec<Measured> =
            children.into_iter().map(|c| parse_child(&c.wait_with_output().unwrap().stdout)).collect();
        report(kind, &format!("procs{procs}"), group, &m);
    }
    let _ = std::fs::remove_dir_all(&store);
}

fn parse_child(out: &[u8]) -> Measured {
    let text = String::from_utf8_lossy(out);
    let v: Vec<f64> = text
        .lines()
        .find_map(|l| l.strip_prefix("CHILD "))
        .expect("a child's figures")
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    Measured {
        start_us: v[0],
        end_us: v[1],
        cpu_us: v[2],
        wchar: v[3],
        commits: v[4],
        jobs: v[5],
        writer_held_us: v[6],
    }
}

/// `--child ENGINE STORE SHAPE PART PARTS JOBS GROUP`: one of the
/// processes of a shared run, one writer thread, every PARTS-th job.
fn child(args: &[String]) {
    let kind = Kind::parse(&args[0]);
    let shape = shape::decode(&std::fs::read(&args[2]).unwrap());
    let num = |i: usize| args[i].parse::<u64>().unwrap();
    let (part, parts, jobs, group) = (num(3), num(4), num(5), num(6) as usize);
    let engine = Engine::open(kind, Path::new(&args[1]));
    let mine: Vec<u64> = (0..jobs).filter(|n| n % parts == part).collect();
    let m = measure(&engine, &shape, &mine, 1, group);
    println!(
        "CHILD {} {} {} {} {} {} {}",
        m.start_us, m.end_us, m.cpu_us, m.wchar, m.commits, m.jobs, m.writer_held_us
    );
    engine.close();
}

fn print_shape(shape: &Shape, left_out: usize) {
    for (i, tx) in shape.txs.iter().enumerate() {
        let count = |f: fn(&Op) -> bool| tx.ops.iter().filter(|op| f(op)).count() as f64;
        let bytes: usize = tx
            .ops
            .iter()
            .map(|op| match op {
                Op::Set(k, v) | Op::StampKey(k, v) | Op::StampValue(k, v) | Op::ByteMax(k, v) => k.len() + v.len(),
                Op::Clear(k) | Op::Add(k, _) => k.len(),
                Op::ClearRange(b, e) => b.len() + e.len(),
                _ => 0,
            })
            .sum();
        line(
            &format!("shape_tx{i}"),
            &[
                ("writes", tx.writes as u8 as f64),
                ("gets", count(|op| matches!(op, Op::Get(_)))),
                ("ranges", count(|op| matches!(op, Op::Range { .. }))),
                ("sets", count(|op| matches!(op, Op::Set(..) | Op::StampKey(..) | Op::StampValue(..)))),
                ("clears", count(|op| matches!(op, Op::Clear(_) | Op::ClearRange(..)))),
                ("adds", count(|op| matches!(op, Op::Add(..) | Op::ByteMax(..)))),
                ("watches_and_conflict_keys", count(|op| matches!(op, Op::Other))),
                ("bytes_written", bytes as f64),
            ],
        );
        if std::env::var_os("CW_ENGINE_SHAPE_VERBOSE").is_some() {
            for op in &tx.ops {
                eprintln!("  tx{i} {}", describe(op));
            }
        }
    }
    line(
        "shape",
        &[
            ("txs", shape.txs.len() as f64),
            ("per_job_keys", shape.per_job.len() as f64),
            ("shared_keys", shape.shared.len() as f64),
            ("left_out_txs", left_out as f64),
        ],
    );
}

fn describe(op: &Op) -> String {
    let p = |b: &[u8]| String::from_utf8_lossy(b).replace(|c: char| c.is_control(), ".");
    match op {
        Op::Get(k) => format!("get {}", p(k)),
        Op::Range { begin, limit, reverse, .. } => format!("range {} limit {limit} rev {reverse}", p(begin)),
        Op::Set(k, v) => format!("set {} ({} B)", p(k), v.len()),
        Op::Clear(k) => format!("clear {}", p(k)),
        Op::ClearRange(b, _) => format!("clear_range {}", p(b)),
        Op::Add(k, d) => format!("add {} {d}", p(k)),
        Op::ByteMax(k, v) => format!("byte_max {} ({} B)", p(k), v.len()),
        Op::StampKey(k, v) => format!("stamped_key {} ({} B)", p(k), v.len()),
        Op::StampValue(k, v) => format!("stamped_value {} ({} B)", p(k), v.len()),
        Op::Other => "watch or conflict key".into(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        return child(&args[1..]);
    }
    if let Some(which) = args.first().and_then(|a| a.strip_prefix("--crash-child=")) {
        return crash::child(which, Path::new(&args[1]));
    }
    let dir = PathBuf::from(args.first().expect("usage: cw_engine_shapes DIR [JOBS] [ONLY]"));
    let jobs: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let only = args.get(2).cloned();
    let engine_only = only.as_deref().and_then(Kind::try_parse);
    ONLY_KIND.with(|k| k.set(engine_only));
    let want = |part: &str| only.as_deref().is_none_or(|o| o == part) || (part == "runs" && engine_only.is_some());
    std::fs::create_dir_all(&dir).unwrap();
    if only.as_deref() == Some("disk-full") {
        return crash::disk_full(&dir);
    }

    let t = Instant::now();
    let (shape, left_out) = record::record(&dir.join("record"));
    let _ = std::fs::remove_dir_all(dir.join("record"));
    std::fs::write(shape_file(&dir), shape::encode(&shape)).unwrap();
    print_shape(&shape, left_out);
    line("recorded", &[("seconds", t.elapsed().as_secs_f64())]);

    // What the replay itself costs (making each job's keys and values
    // from the shape), included in every run's CPU figure.
    let (c0, t0) = (cpu_us(), Instant::now());
    for n in 0..jobs {
        std::hint::black_box(shape.instantiate(n));
    }
    line(
        "replay_itself",
        &[
            ("cpu_us_per_job", (cpu_us() - c0) / jobs as f64),
            ("wall_us_per_job", t0.elapsed().as_secs_f64() * 1e6 / jobs as f64),
        ],
    );

    if want("runs") {
        for kind in [Kind::Embedded, Kind::Sqlite, Kind::LmdbNoSync] {
            for threads in [1, 8] {
                run_one(&dir, &shape, kind, jobs, threads, 1, 1);
            }
            run_one(&dir, &shape, kind, jobs, 1, 2, 1);
        }
        // One fsync per commit: fewer jobs.
        for threads in [1, 8] {
            run_one(&dir, &shape, Kind::LmdbNoMetaSync, (jobs / 10).max(100), threads, 1, 1);
        }
        for kind in [Kind::Sqlite, Kind::LmdbNoSync] {
            for group in [8, 32] {
                for threads in [1, 8] {
                    run_one(&dir, &shape, kind, jobs, threads, 1, group);
                }
            }
        }
        run_one(&dir, &shape, Kind::LmdbNoMetaSync, (jobs / 10).max(100), 8, 1, 8);
    }
    if want("crash") {
        crash::run_all(&dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
