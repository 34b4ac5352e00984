//! I1 counted: what an idle node does each second, by kind.
//!
//! ```text
//! cargo run -p couch_workers_core --example cw_idle -- DIR [SECONDS]
//! ```
//!
//! A node on the embedded store in `DIR` set up as bench I1 sets one up
//! through the API (one worker with the default 15 s timeout, one
//! membership subscription, one `job_accept` waiting longer than the
//! span; a runtime of two `cw-runtime` threads, as the NIF's), then, after
//! 2 s to settle, counts for `SECONDS` (default 30):
//!
//! * every transaction attempt (the retry loop's `transaction` span), by
//!   the first function above the store that ran it (taken from a
//!   backtrace at the span's creation: build without `--release`, where
//!   async functions keep their frames and names; the capture is in the
//!   CPU figures, the symbols are resolved after the window);
//! * per thread: CPU time and time slices (`/proc/self/task/*/schedstat`)
//!   and voluntary context switches (`.../status`: how often it slept and
//!   woke);
//! * the store's SQLite commits.
//!
//! Prints one line per kind and thread, then a JSON summary line. Nothing
//! here asserts: `tests/idle_node.rs` holds the bounds.

use std::backtrace::Backtrace;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use couch_workers_core::log::{count, forward, Discard};
use couch_workers_core::metrics;
use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::Db;
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Node, Settings};
use tracing::span::{Attributes, Id};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// The backtrace of every transaction, unresolved: resolving one (the
/// symbols) costs milliseconds, so it waits until the window is over.
#[derive(Default, Clone)]
struct Kinds(Arc<Mutex<Vec<Backtrace>>>);

impl Kinds {
    /// Transactions since the last take, by the function that ran them.
    fn take(&self) -> BTreeMap<String, u64> {
        let traces = std::mem::take(&mut *self.0.lock().unwrap());
        let mut by_kind = BTreeMap::new();
        for t in traces {
            *by_kind.entry(caller(&t.to_string())).or_default() += 1;
        }
        by_kind
    }
}

/// Counts `transaction` spans (one per run of the retry loop) by caller.
struct CountLayer(Kinds);

impl<S: Subscriber> Layer<S> for CountLayer {
    fn on_new_span(&self, attrs: &Attributes<'_>, _id: &Id, _ctx: Context<'_, S>) {
        if attrs.metadata().name() != "transaction" {
            return;
        }
        let trace = Backtrace::force_capture();
        self.0 .0.lock().unwrap().push(trace);
    }
}

/// The first frame of this crate above the store's retry loop and the
/// jobs' commit helper: the code that wanted the transaction.
fn caller(backtrace: &str) -> String {
    const PLUMBING: [&str; 4] = ["::store::", "::jobs::commit::", "::log::", "cw_idle::"];
    backtrace
        .lines()
        .filter_map(|l| l.trim().split_once(": ").map(|(_, sym)| sym))
        .filter(|sym| sym.starts_with("couch_workers_core::") || sym.starts_with("<couch_workers_core::"))
        .find(|sym| !PLUMBING.iter().any(|p| sym.contains(p)))
        .map(|sym| sym.replace("::{{closure}}", "").trim_end_matches('>').to_string())
        .unwrap_or_else(|| "(unknown)".to_string())
}

/// Per thread (by name): CPU ns, time slices, voluntary context switches.
fn threads() -> BTreeMap<String, (u64, u64, u64)> {
    let mut out: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return out };
    for task in tasks.flatten() {
        let p = task.path();
        let name = std::fs::read_to_string(p.join("comm")).unwrap_or_default().trim().to_string();
        let sched = std::fs::read_to_string(p.join("schedstat")).unwrap_or_default();
        let mut f = sched.split_whitespace().map(|x| x.parse::<u64>().unwrap_or(0));
        let (ns, slices) = (f.next().unwrap_or(0), f.nth(1).unwrap_or(0));
        let status = std::fs::read_to_string(p.join("status")).unwrap_or_default();
        let vol = status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let e = out.entry(name).or_default();
        e.0 += ns;
        e.1 += slices;
        e.2 += vol;
    }
    out
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().expect("usage: cw_idle DIR [SECONDS]");
    let seconds: u64 = args.next().map_or(30, |s| s.parse().expect("SECONDS"));
    let kinds = Kinds::default();
    // log::count(): the store counters read below come from the transaction span.
    let subscriber = tracing_subscriber::registry().with(forward()).with(count()).with(CountLayer(kinds.clone()));
    tracing::subscriber::set_global_default(subscriber).expect("the first subscriber");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("cw-runtime")
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let store = EmbeddedStore::open(EmbeddedOptions::new(&dir)).expect("open the store");
        let db: Db = store.clone();
        let node = Node::with_db(db, Settings::default(), Arc::new(Discard));
        let spec = WorkerSpec { worker_type: b"i1".to_vec(), id: b"idle-1".to_vec(), options_json: b"{}".to_vec(), timeout_s: 15 };
        let reg = node.register_worker(spec).await.expect("register");
        let _sub = node.watch_membership(b"i1".to_vec(), Box::new(|_| {})).expect("subscribe");
        let jobs = node.jobs().clone();
        let incarnation = Some(*reg.incarnation());
        let accept = tokio::spawn(async move {
            jobs.accept_registered(b"i1", b"idle-1", incarnation, Duration::from_secs(seconds + 60)).await
        });
        tokio::time::sleep(Duration::from_secs(2)).await;
        kinds.take();
        let (t0, tx0, c0, started) = (threads(), metrics::STORE.snapshot().transactions, store.sqlite_commits(), Instant::now());
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let span = started.elapsed().as_secs_f64();
        let (t1, tx1, c1, by_kind) = (threads(), metrics::STORE.snapshot().transactions, store.sqlite_commits(), kinds.take());
        println!("{:>8} {:>8}  transactions by caller over {span:.1} s", "count", "per s");
        for (kind, n) in &by_kind {
            println!("{n:>8} {:>8.2}  {kind}", *n as f64 / span);
        }
        println!("{:>10} {:>8} {:>8}  thread", "cpu ms", "slices", "wakes");
        let mut cpu_total = 0.0;
        for (name, (ns, slices, vol)) in &t1 {
            let (ns0, s0, v0) = t0.get(name).copied().unwrap_or_default();
            let ms = ns.saturating_sub(ns0) as f64 / 1e6;
            cpu_total += ms;
            println!("{ms:>10.2} {:>8} {:>8}  {name}", slices.saturating_sub(s0), vol.saturating_sub(v0));
        }
        println!(
            "{{\"seconds\":{span:.1},\"transactions\":{},\"sqlite_commits\":{},\"cpu_ms\":{cpu_total:.2},\"pct_of_one_core\":{:.4}}}",
            tx1 - tx0,
            c1 - c0,
            cpu_total / (span * 1000.0) * 100.0
        );
        accept.abort();
        drop(reg);
        node.stop().await;
    });
}
