//! The job queue driven from Rust, without the NIF or Erlang: the shapes
//! of the benchmark's J1, J1b and J2 on the core's `JobService`, plus a
//! per-stage timing of one `add` and of one accept + finish. Used by the
//! profile in bench/RESULTS.md to separate what the core costs from what
//! the NIF boundary and the Erlang side add. Run by `bench/run --only core`.
//!
//! ```text
//! cargo run --release -p couch_workers_bench --example cw_core_jobs -- DIR [JOBS] [ONLY]
//! ```
//!
//! `ONLY` (optional) runs one part: `J1`, `J1h`, `J1b`, `J2`, `J2t0`,
//! `J2fill` (only J2's fill, so that a count of J2's SQLite statements or
//! WAL frames under `perf stat` can subtract the fill's),
//! `stages` (for strace/perf of one shape), or `sweep`: `add_many` with
//! 1, 2, 4, 8, 16, 32 and 100 jobs per transaction, the upper bound of
//! what a group commit of that many concurrent `add` calls would reach.
//!
//! Runtime: tokio multi-thread with 2 worker threads (the NIF's default).
//! Prints one flat JSON object per figure.

use std::sync::Arc;
use std::time::{Duration, Instant};

use couch_workers_core::jobs::{ops, NewJob};
use couch_workers_core::log::Discard;
use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::{Database, Db, TxOptions};
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Node, Settings};

const INFO: &[u8] = b"{\"n\":1}";

fn id(i: usize) -> Vec<u8> {
    format!("job-{i}").into_bytes()
}

fn line(workload: &str, fields: &[(&str, f64)]) {
    let mut s = format!("{{\"workload\":\"core\",\"variant\":\"{workload}\"");
    for (k, v) in fields {
        s.push_str(&format!(",\"{k}\":{v:.3}"));
    }
    s.push('}');
    println!("{s}");
}

fn pct(sorted: &[u64], p: usize) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len()).div_ceil(100).clamp(1, sorted.len());
    sorted[rank - 1] as f64
}

fn open_node(rt: &tokio::runtime::Runtime, dir: &std::path::Path) -> (Arc<Node>, Arc<EmbeddedStore>) {
    let store = EmbeddedStore::open(EmbeddedOptions::new(dir)).expect("open the store");
    let db: Db = store.clone();
    let node = rt.block_on(async { Node::with_db(db, Settings::default(), Arc::new(Discard)) });
    (node, store)
}

async fn fill(node: &Node, job_type: &[u8], n: usize, batch: usize) {
    let mut i = 0;
    while i < n {
        let last = (i + batch).min(n);
        let jobs: Vec<NewJob> = (i..last).map(|j| NewJob { id: id(j), info: INFO.to_vec(), priority: 0 }).collect();
        node.jobs().add_many(job_type, &jobs).await.expect("add_many");
        i = last;
    }
}

/// Returns the jobs done, the time, and the SQLite commits in that time.
async fn j2(
    node: Arc<Node>,
    store: &EmbeddedStore,
    n: usize,
    workers: usize,
    timeout: Duration,
) -> (usize, Duration, u64) {
    let job_type = b"j2".to_vec();
    fill(&node, &job_type, n, 1000).await;
    let mut regs = Vec::new();
    for w in 0..workers {
        let spec = WorkerSpec {
            worker_type: job_type.clone(),
            id: format!("w{w}").into_bytes(),
            options_json: b"{}".to_vec(),
            timeout_s: 15,
        };
        regs.push(node.register_worker(spec).await.expect("register"));
    }
    let commits_before = store.sqlite_commits();
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let node = node.clone();
            let job_type = job_type.clone();
            tokio::spawn(async move {
                let worker = format!("w{w}").into_bytes();
                let mut count = 0usize;
                let mut last = Instant::now();
                while let Ok(handle) = node.jobs().accept(&job_type, &worker, timeout).await {
                    node.jobs().finish(&handle.fence(), b"{}").await.expect("finish");
                    count += 1;
                    last = Instant::now();
                }
                (count, last)
            })
        })
        .collect();
    let mut total = 0;
    let mut end = started;
    for t in tasks {
        let (c, last) = t.await.expect("task");
        total += c;
        end = end.max(last);
    }
    let commits = store.sqlite_commits() - commits_before;
    drop(regs);
    (total, end - started, commits)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().expect("usage: cw_core_jobs DIR [JOBS]"));
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let only: Option<String> = args.next();
    let want = |part: &str| only.as_deref().is_none_or(|o| o == part);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");

    // J1 in one task: no hand-off between threads per job.
    if want("J1") {
        let (node, store) = open_node(&rt, &dir.join("j1"));
        let t = Instant::now();
        rt.block_on(async {
            for i in 0..n {
                node.jobs().add(b"j1", &id(i), INFO, 0).await.expect("add");
            }
        });
        let s = t.elapsed().as_secs_f64();
        line("J1_in_task", &[("jobs", n as f64), ("seconds", s), ("jobs_per_s", n as f64 / s)]);
        rt.block_on(node.stop());
        store.close();
    }
    // J1 as the NIF does it: a thread outside the runtime spawns each add
    // on the runtime and blocks until the answer comes back.
    if want("J1h") {
        let (node, store) = open_node(&rt, &dir.join("j1h"));
        let t = Instant::now();
        for i in 0..n {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let node2 = node.clone();
            rt.spawn(async move {
                let r = node2.jobs().add(b"j1", &id(i), INFO, 0).await;
                let _ = tx.send(r);
            });
            rx.recv().expect("reply").expect("add");
        }
        let s = t.elapsed().as_secs_f64();
        line("J1_handoff", &[("jobs", n as f64), ("seconds", s), ("jobs_per_s", n as f64 / s)]);
        rt.block_on(node.stop());
        store.close();
    }
    // J1b: batches of 100 in one task.
    if want("J1b") {
        let (node, store) = open_node(&rt, &dir.join("j1b"));
        let t = Instant::now();
        rt.block_on(fill(&node, b"j1b", n, 100));
        let s = t.elapsed().as_secs_f64();
        line("J1b_in_task", &[("jobs", n as f64), ("seconds", s), ("jobs_per_s", n as f64 / s)]);
        rt.block_on(node.stop());
        store.close();
    }
    if only.as_deref() == Some("J2fill") {
        let (node, store) = open_node(&rt, &dir.join("J2"));
        let t = Instant::now();
        rt.block_on(fill(&node, b"j2", n, 1000));
        let s = t.elapsed().as_secs_f64();
        line("J2_fill", &[("jobs", n as f64), ("seconds", s), ("jobs_per_s", n as f64 / s)]);
        rt.block_on(node.stop());
        store.close();
    }
    if want("sweep") {
        for k in [1usize, 2, 4, 8, 16, 32, 100] {
            let (node, store) = open_node(&rt, &dir.join(format!("sweep{k}")));
            let t = Instant::now();
            rt.block_on(fill(&node, b"sw", n, k));
            let s = t.elapsed().as_secs_f64();
            line(&format!("add_many_x{k}"), &[("per_tx", k as f64), ("jobs", n as f64), ("jobs_per_s", n as f64 / s)]);
            rt.block_on(node.stop());
            store.close();
        }
    }
    // J2 with 8 tasks: accept with a timeout (dispatcher), and timeout 0.
    for (name, timeout) in [("J2", Duration::from_millis(1000)), ("J2t0", Duration::ZERO)] {
        if !want(name) {
            continue;
        }
        let (node, store) = open_node(&rt, &dir.join(name));
        let (total, took, commits) = rt.block_on(j2(node.clone(), &store, n, 8, timeout));
        let s = took.as_secs_f64();
        let per_job = commits as f64 / total.max(1) as f64;
        line(
            name,
            &[
                ("jobs", total as f64),
                ("seconds", s),
                ("jobs_per_s", total as f64 / s),
                ("sqlite_commits_per_job", per_job),
            ],
        );
        rt.block_on(node.stop());
        store.close();
    }
    // Stages of one add, done by hand as the retry loop does it: the
    // write transaction's start (in-process writer lock, BEGIN IMMEDIATE,
    // read of last_version), the operation (a point read, 2
    // versionstamped sets, an atomic add = read + write, a versionstamped
    // bump), and the commit (version fix + COMMIT of the WAL frames).
    if want("stages") {
        let (node, store) = open_node(&rt, &dir.join("stages"));
        let ks = node.keyspace().clone();
        let db: Db = store.clone();
        let m = n.min(5000);
        let (mut begin, mut op, mut commit) = (Vec::new(), Vec::new(), Vec::new());
        rt.block_on(async {
            for i in 0..m {
                let job = NewJob { id: id(i), info: INFO.to_vec(), priority: 0 };
                let t0 = Instant::now();
                let tx = db.create_transaction(&TxOptions::write()).await.expect("begin");
                let t1 = Instant::now();
                ops::add(&tx, &ks, b"st", &job).await.expect("add").expect("added");
                let t2 = Instant::now();
                tx.commit().await.expect("commit");
                let t3 = Instant::now();
                begin.push((t1 - t0).as_nanos() as u64);
                op.push((t2 - t1).as_nanos() as u64);
                commit.push((t3 - t2).as_nanos() as u64);
            }
        });
        for v in [&mut begin, &mut op, &mut commit] {
            v.sort_unstable();
        }
        let mean = |v: &Vec<u64>| v.iter().sum::<u64>() as f64 / v.len().max(1) as f64 / 1000.0;
        line(
            "add_stages_us",
            &[
                ("samples", m as f64),
                ("begin_mean_us", mean(&begin)),
                ("begin_p50_us", pct(&begin, 50) / 1000.0),
                ("op_mean_us", mean(&op)),
                ("op_p50_us", pct(&op, 50) / 1000.0),
                ("commit_mean_us", mean(&commit)),
                ("commit_p50_us", pct(&commit, 50) / 1000.0),
            ],
        );
        rt.block_on(node.stop());
        store.close();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
