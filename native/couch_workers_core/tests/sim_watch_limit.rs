//! A node whose store handle is at FoundationDB's watch limit (10,000
//! outstanding, `too_many_watches` 1032), on the `sim` store: membership
//! watchers back off instead of re-reading every 100 ms, the node logs
//! `watch_limit_reached` once for the episode, and when watches free up
//! the watcher delivers again and the episode ends (`watch_limit_cleared`).
//! Job subscription watchers and the accept dispatcher do the same, and
//! the dispatcher keeps serving its waiters meanwhile.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use couch_workers_core::jobs::JobEvent;
use couch_workers_core::log::{Event, Sink};
use couch_workers_core::store::sim::{SimOptions, SimStore, MAX_WATCHES};
use couch_workers_core::store::{Db, TxOptions, Watch};
use couch_workers_core::tasks::watch_limit::AT_LIMIT;
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Node, Settings};
use tokio::sync::mpsc;

const T: &[u8] = b"watch_limit_type";

#[derive(Default)]
struct Collect(Mutex<Vec<&'static str>>);

impl Sink for Collect {
    fn log(&self, event: Event) {
        self.0.lock().unwrap().push(event.what);
    }
}

impl Collect {
    fn count(&self, what: &str) -> usize {
        self.0.lock().unwrap().iter().filter(|w| **w == what).count()
    }
}

fn spec(id: &str) -> WorkerSpec {
    WorkerSpec { worker_type: T.to_vec(), id: id.as_bytes().to_vec(), options_json: b"{}".to_vec(), timeout_s: 30 }
}

async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Arms `MAX_WATCHES` watches on a key nothing changes: the handle is at
/// its limit until the returned watches are dropped.
async fn fill_watches(sim: &Arc<SimStore>) -> Vec<Watch> {
    let db: Db = sim.clone();
    let filler = [db.prefix().as_slice(), b"filler"].concat();
    let tx = db.create_transaction(&TxOptions::write()).await.expect("transaction");
    let held: Vec<_> = (0..MAX_WATCHES).map(|_| tx.watch(&filler)).collect();
    tx.commit().await.expect("commit arms the watches");
    assert_eq!(sim.outstanding_watches(), MAX_WATCHES);
    held
}

/// Read versions the cluster hands out over `window` (every transaction
/// that reads takes one).
/// The most re-reads one watcher can make at the limit within `elapsed`
/// of its first failure: one at once, then one after each pause, each
/// pause at least half its ceiling (`AT_LIMIT`: 100 ms doubling to 10 s),
/// so no sooner than 50, 150, 350, 750, 1550, 3150 ms, ... A fixed 100 ms
/// pause (the bug) makes one every 100 ms. Tests count these against the
/// window they really got, which a busy machine stretches.
fn most_rereads(elapsed: Duration) -> usize {
    let (mut at, mut n) = (Duration::ZERO, 1u32);
    while at <= elapsed {
        at += AT_LIMIT.ceiling(n) / 2;
        n += 1;
    }
    n as usize - 1
}

async fn reads_during(sim: &SimStore, window: Duration) -> u64 {
    let before = sim.stats().read_versions;
    tokio::time::sleep(window).await;
    sim.stats().read_versions - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_watchers_back_off_at_the_watch_limit_and_log_once() {
    const JOBS: usize = 20;
    let sim = SimStore::new(SimOptions::new(1033));
    let db: Db = sim.clone();
    let log = Arc::new(Collect::default());
    let node = Node::with_db(db.clone(), Settings::default(), log.clone());
    let jobs = node.jobs().clone();
    for i in 0..JOBS {
        jobs.add(T, format!("j{i}").as_bytes(), b"{}", 0).await.expect("add");
    }
    let held = fill_watches(&sim).await;

    let started = Instant::now();
    let (sender, mut events) = mpsc::unbounded_channel::<JobEvent>();
    let mut subs = Vec::new();
    for i in 0..JOBS {
        let sender = sender.clone();
        let on = Box::new(move |e| {
            let _ = sender.send(e);
        });
        subs.push(jobs.subscribe(T, format!("j{i}").as_bytes(), on).await.expect("subscribe").1);
    }
    // Over 2 s at the limit, each watcher with a fixed 100 ms pause
    // re-reads ~20 times (400 for 20 jobs); with the backoff at most 5
    // (`most_rereads`). Each re-read at the limit follows one
    // `job_watch_deferred`: those are counted, over the time that really
    // passed. (Counting the store's read versions less a baseline window
    // of the node's own reads failed when the node's other services read
    // more in one window than in the other.)
    tokio::time::sleep(Duration::from_secs(2)).await;
    let deferred = log.count("job_watch_deferred");
    let most = most_rereads(started.elapsed()) * JOBS;
    assert!(
        deferred <= most,
        "{deferred} re-reads by {JOBS} job watchers at the limit in {:?} (most {most})",
        started.elapsed()
    );
    assert!(deferred >= JOBS, "every watcher met the limit");
    assert_eq!(log.count("watch_limit_reached"), 1, "one log line per episode");

    // Watches free up: the watchers arm again and see the next change.
    drop(held);
    wait_until("watches released", Duration::from_secs(5), || sim.outstanding_watches() < MAX_WATCHES).await;
    jobs.add(T, b"accept-me", b"{}", 0).await.expect("add");
    while events.try_recv().is_ok() {}
    let _w = node.register_worker(spec("w")).await.expect("register");
    let handle = jobs.accept(T, b"w", Duration::from_secs(5)).await.expect("accept j0");
    assert_eq!(handle.job.id, b"j0".to_vec());
    jobs.finish(&handle.fence(), b"{}").await.expect("finish");
    let seen = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(e) = events.recv().await {
            if matches!(&e, JobEvent::Changed(j) if j.id == b"j0") {
                return;
            }
        }
    })
    .await;
    assert!(seen.is_ok(), "the watcher of j0 delivered its change after the limit cleared");
    // Its watch is armed now (the change came from a read): the next
    // change fires it, which ends the episode.
    let removed = tokio::time::timeout(Duration::from_secs(20), async {
        while events.try_recv().is_ok() {}
        jobs.remove(T, b"j0").await.expect("remove j0");
        while let Some(e) = events.recv().await {
            if matches!(e, JobEvent::Removed) {
                return;
            }
        }
    })
    .await;
    assert!(removed.is_ok(), "the watcher of j0 saw its removal");
    wait_until("watch_limit_cleared", Duration::from_secs(20), || log.count("watch_limit_cleared") == 1).await;
    drop(subs);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatcher_backs_off_at_the_watch_limit_and_keeps_serving() {
    let sim = SimStore::new(SimOptions::new(1034));
    let db: Db = sim.clone();
    let log = Arc::new(Collect::default());
    let node = Node::with_db(db.clone(), Settings::default(), log.clone());
    let jobs = node.jobs().clone();
    let _w = node.register_worker(spec("w")).await.expect("register");
    let _held = fill_watches(&sim).await;

    // A waiter and no job: the dispatcher's round cannot arm its watch.
    let started = Instant::now();
    let waiter = {
        let jobs = jobs.clone();
        tokio::spawn(async move { jobs.accept(T, b"w", Duration::from_secs(60)).await })
    };
    // Each round that met the limit logs `accept_watch_deferred`. A round
    // every 50 ms would be ~40 in 2 s; with the backoff the rounds start
    // no sooner than 0, 50, 150, 350, 750, 1550 ms (`most_rereads`),
    // counted over the time that really passed since the waiter came, so
    // that a busy machine's longer sleep cannot push them over. (Counting
    // the store's read versions instead mixed in the node's other
    // services, whose cadences made the baseline vary by more than the
    // margin.)
    wait_until("the first round met the limit", Duration::from_secs(5), || log.count("accept_watch_deferred") >= 1)
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rounds = log.count("accept_watch_deferred");
    let most = most_rereads(started.elapsed());
    assert!(
        (2..=most).contains(&rounds),
        "{rounds} accept rounds met the limit in {:?} (most {most})",
        started.elapsed()
    );
    assert_eq!(log.count("watch_limit_reached"), 1, "one log line per episode");

    // Still serving, although no watch can fire: a job added now is taken
    // within the pause (at most 10 s).
    jobs.add(T, b"j", b"{}", 0).await.expect("add");
    let taken = tokio::time::timeout(Duration::from_secs(15), waiter).await;
    let handle = taken.expect("accepted within the pause").expect("task").expect("accept");
    assert_eq!(handle.job.id, b"j".to_vec());
    // And a new waiter is served at once from what is pending.
    jobs.add(T, b"k", b"{}", 0).await.expect("add");
    let _k = node.register_worker(spec("k")).await.expect("register k");
    let next = tokio::time::timeout(Duration::from_secs(5), jobs.accept(T, b"k", Duration::from_secs(30))).await;
    assert_eq!(next.expect("a waiter arriving is served at once").expect("accept").job.id, b"k".to_vec());
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_watcher_backs_off_at_the_watch_limit_and_logs_once() {
    let sim = SimStore::new(SimOptions::new(1032));
    let db: Db = sim.clone();
    let log = Arc::new(Collect::default());
    let node = Node::with_db(db.clone(), Settings::default(), log.clone());

    // Fill the handle: 10,000 armed watches on a key nothing changes.
    let filler = [db.prefix().as_slice(), b"filler"].concat();
    let tx = db.create_transaction(&TxOptions::write()).await.expect("transaction");
    let held: Vec<_> = (0..MAX_WATCHES).map(|_| tx.watch(&filler)).collect();
    tx.commit().await.expect("commit arms the watches");
    assert_eq!(sim.outstanding_watches(), MAX_WATCHES);

    let started = Instant::now();
    let (sender, mut deliveries) = mpsc::unbounded_channel::<usize>();
    let _watch = node
        .watch_membership(
            T.to_vec(),
            Box::new(move |m| {
                let _ = sender.send(m.workers.len());
            }),
        )
        .expect("watch_membership");
    // The read works (only arming fails): the first delivery comes.
    let first = tokio::time::timeout(Duration::from_secs(10), deliveries.recv()).await;
    assert_eq!(first, Ok(Some(0)));

    // Over 2 s at the limit: a fixed 100 ms pause re-reads ~20 times; the
    // backoff at most 5 (`most_rereads`, over the time that really passed
    // since the watch began).
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Every failed watch is followed by one re-read, whichever way it is
    // logged (before the fix: `membership_watch_failed` every 100 ms).
    let (deferred, failed) = (log.count("membership_watch_deferred"), log.count("membership_watch_failed"));
    let most = most_rereads(started.elapsed());
    assert!(
        deferred + failed <= most,
        "{deferred} + {failed} re-reads at the limit in {:?} (most {most})",
        started.elapsed()
    );
    assert!(deferred >= 1, "the watcher re-read at the limit");
    assert_eq!(log.count("watch_limit_reached"), 1, "one log line per episode");

    // Watches free up: the watcher arms again, sees the next changes and
    // the episode ends.
    drop(held);
    wait_until("watches released", Duration::from_secs(5), || sim.outstanding_watches() < MAX_WATCHES).await;
    let _a = node.register_worker(spec("a")).await.expect("register a");
    let seen = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(n) = deliveries.recv().await {
            if n == 1 {
                return;
            }
        }
    })
    .await;
    assert!(seen.is_ok(), "the watcher delivered the new member after the limit cleared");
    let _b = node.register_worker(spec("b")).await.expect("register b");
    wait_until("watch_limit_cleared", Duration::from_secs(20), || log.count("watch_limit_cleared") == 1).await;
    assert_eq!(log.count("watch_limit_reached"), 1);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_at_the_watch_limit_does_not_spin() {
    let sim = SimStore::new(SimOptions::new(1035));
    let db: Db = sim.clone();
    let _held = fill_watches(&sim).await;
    let log = Arc::new(Collect::default());
    // Its orphan sweeper's first watch fails at once: before the backoff
    // it listed the orphan markers again at once, in a loop.
    let node = Node::with_db(db.clone(), Settings::default(), log.clone());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let reads = reads_during(&sim, Duration::from_secs(2)).await;
    assert!(reads <= 60, "{reads} reads in 2 s by an idle node at the watch limit");
    assert_eq!(log.count("watch_limit_reached"), 1, "one log line per episode");
    node.stop().await;
}
