//! How long a raw FoundationDB watch takes to fire after the write that
//! changes its key committed, by how long the watch sat armed before that
//! write (the gap). Two store handles on one cluster (as two nodes): the
//! watch armed through A in a read-only transaction, the key changed
//! through B (an atomic add, as a job's end moves the running counter),
//! timed from B's commit's return to A's watch firing. No couch_workers
//! code runs between the two: this is the floor under every push on
//! FoundationDB (a job added, a run's end under a running limit).
//!
//! ```text
//! cargo run --release -p couch_workers_core --features fdb,testkit --example cw_fdb_watch_gap -- CLUSTER_FILE [CHANGES] [GAPS_MS]
//! ```
//!
//! `CHANGES` (default 60) per gap, `GAPS_MS` a comma-separated list
//! (default `0,1,5,20,100`). Prints one JSON object per gap: p50, p99 and
//! max in µs, and how many fired more than 5 ms late. Works in a directory
//! of its own under `couch_workers_test`, removed at the end.

#[cfg(feature = "fdb")]
fn main() {
    use std::time::{Duration, Instant};

    use couch_workers_core::store::fdb::FdbStore;
    use couch_workers_core::store::{run, Database, TxOptions};

    let args: Vec<String> = std::env::args().collect();
    let Some(cluster_file) = args.get(1) else {
        eprintln!("usage: cw_fdb_watch_gap CLUSTER_FILE [CHANGES] [GAPS_MS]");
        std::process::exit(2);
    };
    let changes: usize = args.get(2).map_or(60, |s| s.parse().expect("CHANGES is a number"));
    let gaps: Vec<u64> = args
        .get(3)
        .map_or("0,1,5,20,100", String::as_str)
        .split(',')
        .map(|s| s.parse().expect("GAPS_MS are numbers"))
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(async move {
        let name = format!("watch-gap-{}", std::process::id());
        let path = std::path::Path::new(cluster_file);
        let a = FdbStore::open_test(path, &name, true).await.expect("open A");
        let b = FdbStore::open_test(path, &name, false).await.expect("open B");
        const KEY: &[u8] = b"watch-gap";
        for gap in gaps {
            let mut fired = Vec::with_capacity(changes);
            for _ in 0..changes {
                let watch = run(a.as_ref(), TxOptions::read(), |tx| async move {
                    tx.get(KEY, true).await?;
                    Ok(tx.watch(KEY))
                })
                .await
                .expect("arm");
                tokio::time::sleep(Duration::from_millis(gap)).await;
                run(b.as_ref(), TxOptions::write(), |tx| async move {
                    tx.atomic_add(KEY, 1);
                    Ok(())
                })
                .await
                .expect("write");
                let committed = Instant::now();
                watch.await.expect("fired");
                fired.push(committed.elapsed());
            }
            fired.sort();
            let at = |p: f64| fired[((fired.len() - 1) as f64 * p).round() as usize].as_micros();
            let late = fired.iter().filter(|d| **d > Duration::from_millis(5)).count();
            println!(
                "{{\"gap_ms\":{gap},\"changes\":{changes},\"p50_us\":{},\"p99_us\":{},\"max_us\":{},\"over_5ms\":{late}}}",
                at(0.5),
                at(0.99),
                at(1.0)
            );
        }
        b.close();
        a.close();
    });
}

#[cfg(not(feature = "fdb"))]
fn main() {
    eprintln!("cw_fdb_watch_gap needs the fdb feature (--features fdb,testkit)");
    std::process::exit(2);
}
