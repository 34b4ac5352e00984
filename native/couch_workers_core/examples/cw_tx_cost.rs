//! What a run of the store's retry loop costs, counted by the run rather
//! than timed: `N` transactions one after another on one task of a
//! current-thread runtime, on the embedded store, each of one shape:
//!
//! * `read`: a read-only transaction that reads one missing key (little
//!   store work, so the loop's own cost, its span included, is the
//!   largest share it can be);
//! * `write`: a one-key write, committed (what `commit_rate` runs).
//!
//! ```text
//! cargo run --release -p couch_workers_core --example cw_tx_cost -- DIR [N] [read|write]
//! ```
//!
//! Prints one JSON object per shape: wall and CPU time (this process's
//! user + system, every thread: the store's writer too) per transaction,
//! and the store's counters' movement. On a shared machine the times are
//! noisy; for a count that is not, run it under `valgrind --tool=cachegrind
//! --cache-sim=no` with two values of `N` and divide the difference of the
//! instruction totals by the difference of `N` (bench/RESULTS.md, "the
//! store's counters from the transaction span").

use std::time::Instant;

use couch_workers_core::metrics::STORE;
use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::{run, Database, TxOptions};

fn cpu_ns() -> u64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    ns(usage.ru_utime) + ns(usage.ru_stime)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().expect("usage: cw_tx_cost DIR [N] [read|write]");
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let only = args.next();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    for shape in ["read", "write"] {
        if only.as_deref().is_some_and(|o| o != shape) {
            continue;
        }
        let sub = std::path::Path::new(&dir).join(shape);
        let db = EmbeddedStore::open(EmbeddedOptions::new(&sub)).expect("open the store");
        let before = STORE.snapshot();
        let (t0, c0) = (Instant::now(), cpu_ns());
        rt.block_on(async {
            for i in 0..n {
                let key = i.to_be_bytes();
                let key = &key;
                if shape == "read" {
                    run(&*db, TxOptions::read(), |tx| async move { tx.get(key, false).await }).await.expect("read");
                } else {
                    run(&*db, TxOptions::write(), |tx| async move {
                        tx.set(key, b"value");
                        Ok(())
                    })
                    .await
                    .expect("commit");
                }
            }
        });
        let (wall, cpu) = (t0.elapsed().as_nanos() as f64 / n as f64, (cpu_ns() - c0) as f64 / n as f64);
        let counted = STORE.snapshot().transactions - before.transactions;
        db.close();
        println!(
            "{{\"workload\":\"tx_cost\",\"variant\":\"{shape}\",\"transactions\":{n},\"counted\":{counted},\
             \"wall_ns_per_tx\":{wall:.0},\"cpu_ns_per_tx\":{cpu:.0}}}"
        );
        let _ = std::fs::remove_dir_all(&sub);
    }
}
