//! Where the time of a cross-handle wake-up goes on the embedded store
//! (M2 and J3x): two store handles on one directory (as two
//! nodes on one host: each its own connections and watcher thread), a
//! watch armed on handle A, a write of the watched key committed through
//! handle B. Each change is timed per stage, on one clock (this process's
//! monotonic clock; the store's own stages from
//! `EmbeddedStore::watch_trace`):
//!
//! * `commit`: B's write transaction, from its start to its commit's return;
//! * `to_event`: B's commit's return → A's watcher thread got the news
//!   (once a `cw-embed-notify` thread, which then rang it):
//!   B's post-commit wake-up (mode `socket`), or an inotify event naming
//!   the WAL (mode `wal`, the fallback; negative: before the return,
//!   since the frames are written inside the commit);
//! * `to_seen`: that event → A's watcher thread finds `data_version`
//!   moved, with the number of looks it took (`looks`: 1 when the first
//!   look found it);
//! * `read`: the watcher's read of the watched keys;
//! * `to_fired`: the read's end → the watch's oneshot sent;
//! * `to_task`: the send → the task awaiting the watch runs (tokio);
//! * `total`: B's commit's return → the task runs (what M2 and J3x time
//!   from the write's return, before any work of the layers above).
//!
//! Also counted (load does not move them): A's watcher thread's wake-ups
//! (voluntary context switches) per change, and the changes whose firing
//! look was woken by the event rather than a timer.
//!
//! ```text
//! cargo run --release -p couch_workers_core --example cw_watch_path -- DIR [CHANGES] [GAP_MS] [socket|wal]
//! ```
//!
//! `CHANGES` (default 500) writes, one every `GAP_MS` (default 10, as
//! J3x); `wal` opens both handles with `wake_socket = false`. Prints one
//! JSON object: p50, p99 and max of every stage, in µs.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore, WakeCause, WatchTrace};
use couch_workers_core::store::{Database, TxOptions};

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn us(later: Instant, earlier: Instant) -> f64 {
    match later.checked_duration_since(earlier) {
        Some(d) => d.as_secs_f64() * 1e6,
        None => -(earlier.duration_since(later).as_secs_f64() * 1e6),
    }
}

#[derive(Default)]
struct Stages {
    commit: Vec<f64>,
    to_event: Vec<f64>,
    to_seen: Vec<f64>,
    looks: Vec<f64>,
    read: Vec<f64>,
    to_fired: Vec<f64>,
    to_task: Vec<f64>,
    total: Vec<f64>,
    /// Changes whose firing look was woken by the event (not a timer).
    by_event: u64,
}

fn summary(name: &str, v: &mut [f64]) -> String {
    v.sort_by(|a, b| a.total_cmp(b));
    format!(
        "\"{name}_p50\":{:.1},\"{name}_p99\":{:.1},\"{name}_max\":{:.1}",
        percentile(v, 50.0),
        percentile(v, 99.0),
        v.last().copied().unwrap_or(f64::NAN)
    )
}

/// Thread ids of this process named `name`.
fn tids(name: &str) -> HashSet<String> {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|t| t.ok())
                .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
                .map(|t| t.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Voluntary context switches of thread `tid` so far: one per sleep.
fn wakeups(tid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("voluntary_ctxt_switches:")).and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

async fn one(a: &Arc<EmbeddedStore>, b: &Arc<EmbeddedStore>, key: &[u8], i: u64, st: &mut Stages) {
    let tx = a.create_transaction(&TxOptions::read()).await.expect("read tx");
    let _ = tx.get(key, true).await.expect("get");
    let watch = tx.watch(key);
    tx.commit().await.expect("arm");
    let woke = tokio::spawn(async move {
        watch.await.expect("fired");
        Instant::now()
    });
    // Let the watcher thread register it and fall asleep.
    tokio::time::sleep(Duration::from_millis(2)).await;
    let started = Instant::now();
    let tx = b.create_transaction(&TxOptions::write()).await.expect("write tx");
    tx.set(key, &i.to_le_bytes());
    tx.commit().await.expect("commit");
    let committed = Instant::now();
    let task = woke.await.expect("task");
    let t: WatchTrace = a.watch_trace().expect("a traced wake-up");
    st.commit.push(us(committed, started));
    st.total.push(us(task, committed));
    st.to_task.push(us(task, t.fired));
    st.to_fired.push(us(t.fired, t.read_done));
    st.read.push(us(t.read_done, t.seen));
    st.looks.push(t.looks as f64);
    let event = match t.cause {
        WakeCause::Peer => t.peer_wake,
        WakeCause::Wal => t.wal_event,
        _ => None,
    };
    if let Some(ev) = event.filter(|ev| *ev >= started) {
        st.by_event += 1;
        st.to_event.push(us(ev, committed));
        st.to_seen.push(us(t.seen, ev));
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().expect("usage: cw_watch_path DIR [CHANGES] [GAP_MS] [socket|wal]");
    let changes: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(500);
    let gap = Duration::from_millis(args.next().and_then(|s| s.parse().ok()).unwrap_or(10));
    let mode = args.next().unwrap_or_else(|| "socket".into());
    let mut opts = EmbeddedOptions::new(&dir);
    opts.wake_socket = match mode.as_str() {
        "socket" => true,
        "wal" => false,
        other => panic!("mode {other}: socket or wal"),
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async move {
        let before = tids("cw-embed-watch");
        let a = EmbeddedStore::open(opts.clone()).expect("open A");
        let b = EmbeddedStore::open(opts).expect("open B");
        let a_watcher = {
            let mut found = Vec::new();
            for _ in 0..500 {
                found = tids("cw-embed-watch").difference(&before).cloned().collect::<Vec<_>>();
                if found.len() == 2 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            // A's thread was started first: the lower id.
            found.sort_by_key(|t| t.parse::<u64>().unwrap_or(u64::MAX));
            found.first().cloned().unwrap_or_default()
        };
        let key = [a.prefix().as_slice(), b"cw_watch_path"].concat();
        let mut st = Stages::default();
        let woke_before = wakeups(&a_watcher);
        for i in 0..changes {
            one(&a, &b, &key, i, &mut st).await;
            tokio::time::sleep(gap).await;
        }
        let watcher_wakeups = wakeups(&a_watcher) - woke_before;
        let events = st.to_event.len();
        let fields = [
            summary("commit_us", &mut st.commit),
            summary("to_event_us", &mut st.to_event),
            summary("to_seen_us", &mut st.to_seen),
            summary("looks", &mut st.looks),
            summary("read_us", &mut st.read),
            summary("to_fired_us", &mut st.to_fired),
            summary("to_task_us", &mut st.to_task),
            summary("total_us", &mut st.total),
        ];
        println!(
            "{{\"example\":\"cw_watch_path\",\"mode\":\"{mode}\",\"changes\":{changes},\"gap_ms\":{},\"fired_by_event\":{},\
             \"watcher_wakeups_per_change\":{:.2},\"events_timed\":{events},{}}}",
            gap.as_millis(),
            st.by_event,
            watcher_wakeups as f64 / changes as f64,
            fields.join(",")
        );
        a.close();
        b.close();
    });
}
