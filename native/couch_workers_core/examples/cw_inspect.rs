//! What operations' reads cost (`inspect.rs`): `workers/1` of a type with
//! many workers and `worker_types/0` of a store with many types, each
//! timed over repeated runs on the embedded store.
//!
//! ```text
//! cargo run --release -p couch_workers_core --example cw_inspect -- DIR [WORKERS] [TYPES] [RUNS]
//! ```
//!
//! Defaults: 10,000 workers of one type (options `{"slots":4,"node":"n1"}`,
//! 2,000 of them with one running job), 100 more types of 10 workers each,
//! 50 timed runs of each read. Workers are written straight into the key
//! space in batches (no heartbeat tasks run during the measurement).
//! Prints one flat JSON object: medians and p99s in ms.

use std::time::Instant;

use couch_workers_core::log::Discard;
use couch_workers_core::roster;
use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::{run, Db, TxOptions};
use couch_workers_core::workers::{self, WorkerSpec};
use couch_workers_core::{Node, Settings};

fn spec(t: &str, id: &str) -> WorkerSpec {
    WorkerSpec {
        worker_type: t.as_bytes().to_vec(),
        id: id.as_bytes().to_vec(),
        options_json: br#"{"slots":4,"node":"n1"}"#.to_vec(),
        timeout_s: 3600,
    }
}

fn pct(sorted: &[f64], p: usize) -> f64 {
    let rank = (p * sorted.len()).div_ceil(100).clamp(1, sorted.len());
    sorted[rank - 1]
}

async fn write_workers(db: &Db, node: &Node, t: &str, n: usize) {
    let ks = node.keyspace().clone();
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let specs: Vec<WorkerSpec> = chunk.iter().map(|i| spec(t, &format!("w{i:06}"))).collect();
        let (ks, specs) = (&ks, &specs);
        run(db.as_ref(), TxOptions::write(), |tx| async move {
            for s in specs {
                roster::register(&tx, ks, s, &workers::new_incarnation(), 0).await?;
            }
            Ok(())
        })
        .await
        .expect("register batch");
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = args.get(1).expect("DIR");
    let n: usize = args.get(2).map_or(10_000, |s| s.parse().expect("WORKERS"));
    let types: usize = args.get(3).map_or(100, |s| s.parse().expect("TYPES"));
    let runs: usize = args.get(4).map_or(50, |s| s.parse().expect("RUNS"));
    let db: Db = EmbeddedStore::open(EmbeddedOptions::new(dir)).expect("open");
    let node = Node::with_db(db.clone(), Settings::default(), std::sync::Arc::new(Discard));
    write_workers(&db, &node, "big", n).await;
    for t in 0..types {
        write_workers(&db, &node, &format!("t{t:04}"), 10).await;
    }
    // One running job on every fifth worker of "big".
    let running = n / 5;
    for i in 0..running {
        node.jobs().add(b"big", format!("j{i:06}").as_bytes(), b"{}", 0).await.expect("add");
    }
    for i in 0..running {
        let w = format!("w{:06}", i * 5);
        node.jobs().accept(b"big", w.as_bytes(), std::time::Duration::ZERO).await.expect("accept");
    }
    let mut w_ms = Vec::with_capacity(runs);
    let mut t_ms = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t0 = Instant::now();
        let ws = node.context().workers(b"big").await.expect("workers");
        w_ms.push(t0.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(ws.len(), n);
        assert_eq!(ws.iter().map(|w| w.running).sum::<u64>(), running as u64);
        let t0 = Instant::now();
        let ts = node.context().worker_types().await.expect("types");
        t_ms.push(t0.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(ts.len(), types + 1);
    }
    w_ms.sort_by(f64::total_cmp);
    t_ms.sort_by(f64::total_cmp);
    println!(
        "{{\"workers\":{n},\"running\":{running},\"types\":{},\"runs\":{runs},\"workers_p50_ms\":{:.2},\"workers_p99_ms\":{:.2},\"worker_types_p50_ms\":{:.2},\"worker_types_p99_ms\":{:.2}}}",
        types + 1,
        pct(&w_ms, 50),
        pct(&w_ms, 99),
        pct(&t_ms, 50),
        pct(&t_ms, 99)
    );
    node.stop().await;
}
