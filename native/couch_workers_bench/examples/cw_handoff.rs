//! What one hand-off between a calling thread and the tokio runtime costs
//! on this machine, with no store work at all: the shape of every NIF call
//! that touches the store (the caller's thread spawns a task on the
//! runtime, the task answers, the caller wakes). Run by `bench/run`
//! (workload `handoff`).
//!
//! ```text
//! cargo run --release -p couch_workers_bench --example cw_handoff -- [CALLS]
//! ```
//!
//! Variants, each a round trip per call, from a thread outside the runtime
//! (as a BEAM scheduler is), runtime of 2 worker threads:
//!
//! * `blocking`: `spawn` of an empty task that answers on a std channel;
//!   the caller blocks in `recv` (both sides sleep and are woken: what a
//!   NIF call + `receive` costs when the scheduler goes to sleep);
//! * `spinning`: the same, the caller spinning on `try_recv` (only the
//!   runtime side sleeps: the BEAM's scheduler busy-wait, at best);
//! * `inline`: the empty task's work run on the caller's thread (the
//!   floor: no hand-off).

use std::sync::mpsc;
use std::time::Instant;

fn pct(sorted: &[u64], p: usize) -> f64 {
    let rank = (p * sorted.len()).div_ceil(100).clamp(1, sorted.len());
    sorted[rank - 1] as f64 / 1000.0
}

fn report(variant: &str, mut lat: Vec<u64>) {
    lat.sort_unstable();
    let mean = lat.iter().sum::<u64>() as f64 / lat.len() as f64 / 1000.0;
    println!(
        "{{\"workload\":\"handoff\",\"variant\":\"{variant}\",\"calls\":{},\"mean_us\":{mean:.2},\"p50_us\":{:.2},\"p99_us\":{:.2},\
         \"source\":\"rust_example cw_handoff\"}}",
        lat.len(),
        pct(&lat, 50),
        pct(&lat, 99)
    );
}

fn main() {
    let calls: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    for (variant, spin) in [("blocking", false), ("spinning", true)] {
        let mut lat = Vec::with_capacity(calls);
        for i in 0..calls {
            let (tx, rx) = mpsc::sync_channel(1);
            let t = Instant::now();
            rt.spawn(async move {
                let _ = tx.send(std::hint::black_box(i));
            });
            if spin {
                loop {
                    match rx.try_recv() {
                        Ok(_) => break,
                        Err(mpsc::TryRecvError::Empty) => std::hint::spin_loop(),
                        Err(e) => panic!("{e}"),
                    }
                }
            } else {
                rx.recv().expect("reply");
            }
            lat.push(t.elapsed().as_nanos() as u64);
            // Let both sides go idle between calls, as in J1 (the caller
            // does a little Erlang work between awaited calls).
            std::thread::yield_now();
        }
        report(variant, lat);
    }
    let mut lat = Vec::with_capacity(calls);
    for i in 0..calls {
        let t = Instant::now();
        std::hint::black_box(i);
        lat.push(t.elapsed().as_nanos() as u64);
    }
    report("inline", lat);
}
