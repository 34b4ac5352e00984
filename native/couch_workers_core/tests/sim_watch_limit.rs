//! A node whose store handle is at FoundationDB's watch limit (10,000
//! outstanding, `too_many_watches` 1032), on the `sim` store: membership
//! watchers back off instead of re-reading every 100 ms, the node logs
//! `watch_limit_reached` once for the episode, and when watches free up
//! the watcher delivers again and the episode ends (`watch_limit_cleared`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use couch_workers_core::log::{Event, Sink};
use couch_workers_core::store::sim::{SimOptions, SimStore, MAX_WATCHES};
use couch_workers_core::store::{Db, TxOptions};
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

    let (sender, mut deliveries) = mpsc::unbounded_channel::<usize>();
    let _watch = node
        .watch_membership(T.to_vec(), Box::new(move |m| {
            let _ = sender.send(m.workers.len());
        }))
        .expect("watch_membership");
    // The read works (only arming fails): the first delivery comes.
    let first = tokio::time::timeout(Duration::from_secs(10), deliveries.recv()).await;
    assert_eq!(first, Ok(Some(0)));

    // Over 2 s at the limit: a fixed 100 ms pause re-reads ~20 times; the
    // backoff (100, 200, 400, 800 ms ceilings, each draw at least half)
    // at most 7.
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Every failed watch is followed by one re-read, whichever way it is
    // logged (before the fix: `membership_watch_failed` every 100 ms).
    let (deferred, failed) = (log.count("membership_watch_deferred"), log.count("membership_watch_failed"));
    assert!(deferred + failed <= 7, "{deferred} + {failed} re-reads at the limit in 2 s");
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
