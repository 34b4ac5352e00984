//! An idle node with 100 schedules sleeps until the earliest slot: it
//! runs no transaction on a timer and stays under 0.1 % of a core. One
//! test per binary: it reads the process-wide transaction counter and the
//! process's CPU time.

mod jobs_common;

use std::time::Duration;

use couch_workers_core::jobs::JobOpts;
use couch_workers_core::metrics;
use couch_workers_core::recurring::Schedules;
use jobs_common::*;

/// User + system CPU time of this process.
fn cpu_time() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes the struct it is given.
    let usage = unsafe {
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()), 0);
        usage.assume_init()
    };
    let tv = |t: libc::timeval| Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_with_100_schedules_sleeps_until_the_earliest_slot() {
    let c = Cluster::new();
    let node = c.node();
    let s = Schedules::new(node.context().clone());
    for i in 0..100 {
        let id = format!("s{i}");
        // Hourly and daily slots: none falls in the window but by chance
        // at an hour's turn (then a few transactions, still few).
        let spec = if i % 2 == 0 { r#"{"every": 3600000}"# } else { r#"{"cron": "17 3 * * *"}"# };
        s.set(b"idle", id.as_bytes(), spec.as_bytes(), b"{}", &JobOpts::default(), None).await.expect("set");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (tx_before, cpu_before) = (metrics::STORE.snapshot().transactions, cpu_time());
    tokio::time::sleep(Duration::from_secs(8)).await;
    let (ran, cpu) = (metrics::STORE.snapshot().transactions - tx_before, cpu_time() - cpu_before);
    eprintln!("an idle node with 100 schedules: {ran} transactions, {cpu:?} CPU in 8 s");
    assert!(ran <= 3, "an idle node with 100 schedules ran {ran} transactions in 8 s");
    assert!(
        cpu < Duration::from_millis(8),
        "an idle node with 100 schedules used {cpu:?} of CPU in 8 s (0.1 % is 8 ms)"
    );
    node.stop().await;
}
