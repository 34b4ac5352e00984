//! The embedded store's raw commit rate: "empty-ish" write transactions
//! (one 16-byte key, a 5-byte value, through the same retry loop every
//! key-space operation uses) per second, on a tokio runtime of 2 worker
//! threads (the NIF's default). Run by `bench/run` (workload
//! `commit_rate`); no NIF call exposes a bare commit, so this is measured
//! in Rust and labelled so.
//!
//! ```text
//! cargo run --release -p couch_workers_bench --example cw_commit_rate -- DIR [SECONDS]
//! ```
//!
//! Prints one flat JSON object per configuration: synchronous=NORMAL (the
//! store's default) with 1 and 4 concurrent tasks, and synchronous=FULL
//! (fsync per commit) with 1 task, each with the store's own durability
//! string; and NORMAL, 1 task, with one pending watch on an unrelated key
//! (`watched`): a running node always has one (the orphan sweeper watches
//! `orphans_vs`), and then every commit wakes the store's watcher thread,
//! which re-reads the watched keys in a read transaction of its own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore, Synchronous};
use couch_workers_core::store::{run, Database, TxOptions, Watch};

async fn commit_rate(db: Arc<EmbeddedStore>, tasks: usize, span: Duration) -> (u64, Duration, Vec<u64>) {
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let db = db.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                let mut lat = Vec::new();
                while started.elapsed() < span {
                    let one = Instant::now();
                    let key = [&(t as u64).to_be_bytes()[..], &n.to_be_bytes()].concat();
                    let key = &key;
                    run(&*db, TxOptions::write(), |tx| async move {
                        tx.set(key, b"value");
                        Ok(())
                    })
                    .await
                    .expect("commit");
                    lat.push(one.elapsed().as_micros() as u64);
                    n += 1;
                }
                (n, lat)
            })
        })
        .collect();
    let mut total = 0;
    let mut all = Vec::new();
    for h in handles {
        let (n, lat) = h.await.expect("task");
        total += n;
        all.extend(lat);
    }
    (total, started.elapsed(), all)
}

fn pct(sorted: &[u64], p: usize) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len()).div_ceil(100).clamp(1, sorted.len());
    sorted[rank - 1] as f64 / 1000.0
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push(' '),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().expect("usage: cw_commit_rate DIR [SECONDS]");
    let secs: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(3);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    for (sync, tasks, watched) in [
        (Synchronous::Normal, 1usize, false),
        (Synchronous::Normal, 4, false),
        (Synchronous::Full, 1, false),
        (Synchronous::Normal, 1, true),
    ] {
        let sub = std::path::Path::new(&dir).join(format!("{sync:?}_{tasks}_{watched}"));
        let mut opts = EmbeddedOptions::new(&sub);
        opts.synchronous = sync;
        let db = EmbeddedStore::open(opts).expect("open the store");
        let durability = db.durability();
        // A pending watch on a key nobody writes (kept alive, never awaited).
        let _watch: Option<Watch> = watched.then(|| {
            rt.block_on(run(&*db, TxOptions::read(), |tx| async move {
                tx.get(b"\xfe-unwritten", false).await?;
                Ok(tx.watch(b"\xfe-unwritten"))
            }))
            .expect("watch")
        });
        let (n, elapsed, mut lat) = rt.block_on(commit_rate(db.clone(), tasks, Duration::from_secs(secs)));
        db.close();
        lat.sort_unstable();
        let name = match sync {
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
        };
        println!(
            "{{\"workload\":\"commit_rate\",\"variant\":\"{}_{}task{}\",\"synchronous\":\"{}\",\"tasks\":{},\
             \"commits\":{},\"seconds\":{:.3},\"commits_per_s\":{:.1},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\
             \"source\":\"rust_example cw_commit_rate (no NIF call exposes a bare commit)\",\"durability\":{}}}",
            name.to_lowercase(),
            tasks,
            if watched { "_watched" } else { "" },
            name,
            tasks,
            n,
            elapsed.as_secs_f64(),
            n as f64 / elapsed.as_secs_f64(),
            pct(&lat, 50),
            pct(&lat, 99),
            json_str(&durability)
        );
        let _ = std::fs::remove_dir_all(&sub);
    }
}
