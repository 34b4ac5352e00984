//! M4 on the core, without the NIF: what one membership change costs with
//! a small and a large membership. Run by `bench/run` (workload `M4core`).
//!
//! ```text
//! cargo run --release -p couch_workers_bench --example cw_membership -- DIR [SIZES] [CHANGES]
//! ```
//!
//! `SIZES` is a comma-separated list (default `100,10000`), `CHANGES` the
//! joins timed at each size (default 20). For each size: that many
//! workers registered (timeout 3600 s: no heartbeat falls inside the
//! measurement), a membership watcher started, then `CHANGES` joins one
//! after another, each timed from just before `register_worker` to the
//! watcher's callback that contains the new worker. Also the store work
//! of one change, timed on its own (mean of 20): `changes_read_ms`, the
//! read a watcher runs per change (`workers::read_membership_changes`
//! since the versionstamp before the last join), next to `full_read_ms`,
//! the read of the whole member range (`workers::read_membership`, what a
//! watcher runs at start); and this process's CPU time per change
//! (getrusage, less the idle rate measured over 1 s before the joins),
//! which includes handing the watcher's callback the whole membership.
//! Prints one flat JSON object per size.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use couch_workers_core::log::Discard;
use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::{run, Db, TxOptions};
use couch_workers_core::workers::{self, WorkerSpec};
use couch_workers_core::{Node, Settings};

fn cpu_ms() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1000.0 + t.tv_usec as f64 / 1000.0;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn spec(id: &str) -> WorkerSpec {
    WorkerSpec {
        worker_type: b"m4".to_vec(),
        id: id.as_bytes().to_vec(),
        options_json: b"{\"timeout\":3600}".to_vec(),
        timeout_s: 3600,
    }
}

fn pct(sorted: &[f64], p: usize) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len()).div_ceil(100).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// What the watcher's callback saw: arrival time and size (the callback
/// does nothing else, so that its own work does not grow with the size;
/// joins are one at a time, so the size tells which have arrived).
type Seen = Arc<Mutex<Vec<(Instant, usize)>>>;

async fn wait_for(seen: &Seen, pred: impl Fn(usize) -> bool) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some((t, _)) = seen.lock().unwrap().iter().find(|(_, n)| pred(*n)) {
            return *t;
        }
        assert!(Instant::now() < deadline, "no such delivery within 60 s");
        tokio::time::sleep(Duration::from_micros(100)).await;
    }
}

async fn one_size(dir: &std::path::Path, size: usize, changes: usize) {
    let store = EmbeddedStore::open(EmbeddedOptions::new(dir)).expect("open the store");
    let db: Db = store.clone();
    let node = Node::with_db(db.clone(), Settings::default(), Arc::new(Discard));
    let mut regs = Vec::with_capacity(size + changes);
    let r0 = Instant::now();
    for chunk in (0..size).collect::<Vec<_>>().chunks(500) {
        let futs = chunk.iter().map(|i| node.register_worker(spec(&format!("w-{i}"))));
        for r in futures::future::join_all(futs).await {
            regs.push(r.expect("register"));
        }
    }
    let register_s = r0.elapsed().as_secs_f64();
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let _watch = node
        .watch_membership(
            b"m4".to_vec(),
            Box::new(move |m| {
                let t = Instant::now();
                s2.lock().unwrap().push((t, m.workers.len()));
            }),
        )
        .expect("watch");
    wait_for(&seen, |n| n >= size).await;
    // Idle CPU rate: the reaper's scans, the watcher thread's polls.
    let (i0, c0) = (Instant::now(), cpu_ms());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_per_ms = (cpu_ms() - c0) / i0.elapsed().as_secs_f64() / 1000.0;
    let ks = node.keyspace().clone();
    let (j0, c1) = (Instant::now(), cpu_ms());
    let mut lat = Vec::with_capacity(changes);
    let mut before_last = [0u8; 10];
    for k in 0..changes {
        let id = format!("extra_{k}");
        if k + 1 == changes {
            before_last = run(db.as_ref(), TxOptions::read(), |tx| {
                let ks = &ks;
                async move { workers::read_membership_vs(&tx, ks, b"m4").await }
            })
            .await
            .expect("vs");
        }
        let t0 = Instant::now();
        regs.push(node.register_worker(spec(&id)).await.expect("register"));
        let t1 = wait_for(&seen, |n| n > size + k).await;
        lat.push((t1 - t0).as_secs_f64() * 1000.0);
    }
    let elapsed_ms = j0.elapsed().as_secs_f64() * 1000.0;
    let cpu_raw = cpu_ms() - c1;
    let cpu = (cpu_raw - idle_per_ms * elapsed_ms).max(0.0);
    // The store work of one change, timed on its own.
    let reads = 20;
    let t = Instant::now();
    let mut changed = 0;
    for _ in 0..reads {
        let c = run(db.as_ref(), TxOptions::read(), |tx| {
            let ks = &ks;
            let since = &before_last;
            async move { workers::read_membership_changes(&tx, ks, b"m4", since).await }
        })
        .await
        .expect("read changes");
        changed = c.changes.len();
    }
    let changes_read_ms = t.elapsed().as_secs_f64() * 1000.0 / reads as f64;
    let t = Instant::now();
    let mut rows = 0;
    for _ in 0..reads {
        let m = run(db.as_ref(), TxOptions::read(), |tx| {
            let ks = &ks;
            async move { workers::read_membership(&tx, ks, b"m4").await }
        })
        .await
        .expect("read");
        rows = m.workers.len();
    }
    let full_read_ms = t.elapsed().as_secs_f64() * 1000.0 / reads as f64;
    lat.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{{\"workload\":\"M4core\",\"variant\":\"members_{size}\",\"members\":{size},\"changes\":{changes},\
         \"register_seconds\":{register_s:.3},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"max_ms\":{:.3},\
         \"cpu_ms_per_change\":{:.3},\"cpu_ms_per_change_raw\":{:.3},\"idle_cpu_ms_per_s\":{:.3},\
         \"changes_read_ms\":{changes_read_ms:.3},\"changes_read_entries\":{changed},\
         \"full_read_ms\":{full_read_ms:.3},\"full_read_rows\":{rows},\"source\":\"rust_example cw_membership (core, no NIF)\"}}",
        pct(&lat, 50),
        pct(&lat, 99),
        lat.last().copied().unwrap_or(0.0),
        cpu / changes as f64,
        cpu_raw / changes as f64,
        idle_per_ms * 1000.0,
    );
    drop(_watch);
    drop(regs);
    node.stop().await;
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().expect("usage: cw_membership DIR [SIZES] [CHANGES]"));
    let sizes: Vec<usize> =
        args.next().map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect()).unwrap_or_else(|| vec![100, 10_000]);
    let changes: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(20);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    for size in sizes {
        let sub = dir.join(format!("m{size}"));
        rt.block_on(one_size(&sub, size, changes));
        let _ = std::fs::remove_dir_all(&sub);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
