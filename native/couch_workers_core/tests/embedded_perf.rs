//! Rough figures for the embedded store, not run by default:
//!
//! ```text
//! cargo test --release -p couch_workers_core --test embedded_perf -- --ignored --nocapture --test-threads=1
//! ```
//!
//! Each prints its figure and asserts a floor far below what any machine
//! should reach, so a regression by orders of magnitude fails.

use std::sync::Arc;
use std::time::{Duration, Instant};

use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore, Synchronous};
use couch_workers_core::store::{run, Database, TxOptions};

/// Commits per second of one-key write transactions over `span`, from
/// `tasks` concurrent tasks.
async fn commit_rate(db: Arc<EmbeddedStore>, tasks: usize, span: Duration) -> (f64, Duration) {
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let db = db.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                let mut worst = Duration::ZERO;
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
                    worst = worst.max(one.elapsed());
                    n += 1;
                }
                (n, worst)
            })
        })
        .collect();
    let mut total = 0;
    let mut worst = Duration::ZERO;
    for h in handles {
        let (n, w) = h.await.expect("task");
        total += n;
        worst = worst.max(w);
    }
    (total as f64 / started.elapsed().as_secs_f64(), worst)
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "benchmark: run with --ignored --nocapture"]
async fn bench_commit_rate() {
    for (sync, tasks) in [(Synchronous::Normal, 1), (Synchronous::Normal, 4), (Synchronous::Full, 1)] {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut opts = EmbeddedOptions::new(dir.path());
        opts.synchronous = sync;
        let db = EmbeddedStore::open(opts).expect("open");
        let (rate, worst) = commit_rate(db.clone(), tasks, Duration::from_secs(2)).await;
        eprintln!("commit rate, {sync:?}, {tasks} task(s): {rate:.0}/s, slowest commit {worst:?}");
        assert!(rate > 50.0);
    }
}

/// CPU time (ns) of this process's threads named `name`.
fn thread_cpu_ns(name: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    tasks
        .filter_map(|t| t.ok())
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next().and_then(|ns| ns.parse::<u64>().ok()))
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "benchmark: run with --ignored --nocapture"]
async fn bench_idle_watcher_cpu() {
    let span = Duration::from_secs(3);
    let pct = |ns: u64| ns as f64 / span.as_nanos() as f64 * 100.0;
    for (wal_notify, idle_poll) in
        [(true, Duration::from_millis(4)), (false, Duration::from_millis(1)), (false, Duration::from_millis(4))]
    {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut opts = EmbeddedOptions::new(dir.path());
        opts.wal_notify = wal_notify;
        opts.watch_poll_idle = idle_poll;
        let db = EmbeddedStore::open(opts).expect("open");
        let before = thread_cpu_ns("cw-embed-watch");
        tokio::time::sleep(span).await;
        let no_watch = thread_cpu_ns("cw-embed-watch") - before;
        let w = run(&*db, TxOptions::read(), |tx| async move { Ok(tx.watch(b"k")) }).await.expect("watch");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = thread_cpu_ns("cw-embed-watch");
        tokio::time::sleep(span).await;
        let polling = thread_cpu_ns("cw-embed-watch") - before;
        drop(w);
        db.close();
        eprintln!(
            "watcher thread CPU over {span:?}: no watch {:.3}% of one core; one pending watch, \
             no commits, wal_notify {wal_notify}, idle poll {idle_poll:?}: {:.3}%",
            pct(no_watch),
            pct(polling)
        );
        assert!(pct(no_watch) < 0.5);
        assert!(pct(polling) < 20.0);
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "benchmark: run with --ignored --nocapture"]
async fn bench_cross_handle_watch_latency() {
    for wal_notify in [true, false] {
        cross_handle_watch_latency(wal_notify).await;
    }
}

async fn cross_handle_watch_latency(wal_notify: bool) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut opts = EmbeddedOptions::new(dir.path());
    opts.wal_notify = wal_notify;
    let a = EmbeddedStore::open(opts.clone()).expect("open");
    let b = EmbeddedStore::open(opts).expect("open");
    let mut latencies = Vec::new();
    for i in 0u32..100 {
        let w = run(&*a, TxOptions::read(), |tx| async move { Ok(tx.watch(b"k")) }).await.expect("watch");
        let waiter = tokio::spawn(async move { (w.await, Instant::now()) });
        tokio::time::sleep(Duration::from_millis(3)).await;
        let tx = b.create_transaction(&TxOptions::write()).await.expect("tx");
        tx.set(b"k", &i.to_be_bytes());
        tx.commit().await.expect("commit");
        let committed = Instant::now();
        let (r, fired) = waiter.await.expect("waiter");
        r.expect("fires");
        latencies.push(fired.saturating_duration_since(committed));
    }
    latencies.sort();
    let p = |q: usize| latencies[(latencies.len() - 1) * q / 100];
    eprintln!(
        "cross-handle watch latency over 100 changes, wal_notify {wal_notify}: median {:?}, p90 {:?}, p99 {:?}, max {:?}",
        p(50),
        p(90),
        p(99),
        p(100)
    );
    assert!(p(50) < Duration::from_millis(50));
}
