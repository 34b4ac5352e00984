//! H1: what heartbeats cost the store at scale. Run by `bench/run`
//! (workload `H1`).
//!
//! ```text
//! cargo run --release -p couch_workers_bench --example cw_heartbeats -- DIR [WORKERS] [SECONDS] [TIMEOUT_S]
//! ```
//!
//! Two nodes (two store handles on one store directory, as two VMs of one
//! host would have) register `WORKERS` workers between them (default
//! 10,000, half on each; timeout `TIMEOUT_S`, default 15 s, the API's
//! default: a heartbeat period of 5 s). After one period for the
//! registrations' own writes to pass, it counts for `SECONDS` (default 20)
//! the SQLite commits of both handles (everything the nodes commit: the
//! heartbeats, and the reapers' passes), every transaction the nodes ran
//! (`metrics::STORE`, reads included), and the nodes' heartbeat
//! transactions (`Node::heartbeat_transactions`). Prints one flat JSON
//! object.

use std::sync::Arc;
use std::time::{Duration, Instant};

use couch_workers_core::log::Discard;
use couch_workers_core::metrics;
use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::Db;
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Node, Registration, Settings};

fn spec(id: &str, timeout_s: u64) -> WorkerSpec {
    WorkerSpec {
        worker_type: b"h1".to_vec(),
        id: id.as_bytes().to_vec(),
        options_json: format!("{{\"timeout\":{timeout_s}}}").into_bytes(),
        timeout_s,
    }
}

async fn register_many(node: &Arc<Node>, prefix: &str, n: usize, timeout_s: u64) -> Vec<Registration> {
    let mut regs = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let futs = chunk.iter().map(|i| node.register_worker(spec(&format!("{prefix}-{i}"), timeout_s)));
        for r in futures::future::join_all(futs).await {
            regs.push(r.expect("register"));
        }
    }
    regs
}

async fn measure(dir: &std::path::Path, workers: usize, seconds: u64, timeout_s: u64) {
    let stores: Vec<Arc<EmbeddedStore>> =
        (0..2).map(|_| EmbeddedStore::open(EmbeddedOptions::new(dir)).expect("open the store")).collect();
    let nodes: Vec<Arc<Node>> = stores
        .iter()
        .map(|s| {
            let db: Db = s.clone();
            Node::with_db(db, Settings::default(), Arc::new(Discard))
        })
        .collect();
    let r0 = Instant::now();
    let (a, b) = tokio::join!(
        register_many(&nodes[0], "a", workers / 2, timeout_s),
        register_many(&nodes[1], "b", workers - workers / 2, timeout_s)
    );
    let register_s = r0.elapsed().as_secs_f64();
    // One period: the registrations' first heartbeats fall due in it.
    tokio::time::sleep(Duration::from_millis(timeout_s * 1000 / 3)).await;
    let commits = || stores.iter().map(|s| s.sqlite_commits()).sum::<u64>();
    let beats = || nodes.iter().map(|n| n.heartbeat_transactions()).sum::<u64>();
    let (c0, t0, h0, i0) = (commits(), metrics::STORE.snapshot().transactions, beats(), Instant::now());
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let span = i0.elapsed().as_secs_f64();
    let (c1, t1, h1) = (commits(), metrics::STORE.snapshot().transactions, beats());
    let alive = nodes.iter().map(|n| n.stats().heartbeats).sum::<usize>();
    println!(
        "{{\"workload\":\"H1\",\"workers\":{workers},\"nodes\":2,\"timeout_s\":{timeout_s},\"seconds\":{span:.3},\
         \"register_seconds\":{register_s:.3},\"heartbeating\":{alive},\
         \"commits_per_s\":{:.1},\"transactions_per_s\":{:.1},\"heartbeat_transactions_per_s\":{:.1},\
         \"source\":\"rust_example cw_heartbeats (core, no NIF)\"}}",
        (c1 - c0) as f64 / span,
        (t1 - t0) as f64 / span,
        (h1 - h0) as f64 / span,
    );
    drop(a);
    drop(b);
    for n in &nodes {
        n.stop().await;
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().expect("usage: cw_heartbeats DIR [WORKERS] [SECONDS] [TIMEOUT_S]"));
    let workers: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let seconds: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(20);
    let timeout_s: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(15);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(measure(&dir, workers, seconds, timeout_s));
    let _ = std::fs::remove_dir_all(&dir);
}
