//! Wake-ups of the watcher (`store/embedded/notify.rs`, `wake.rs`): a
//! commit through another handle (another connection, as another
//! process's) fires watches with and without notifications, none is
//! missed when commits follow each other closely, a quiet store does not
//! wake the watcher thread, and neither do the handle's own commits.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::{run, Database, TxOptions};

fn open(dir: &std::path::Path, wal_notify: bool) -> Arc<EmbeddedStore> {
    let mut opts = EmbeddedOptions::new(dir);
    opts.wal_notify = wal_notify;
    EmbeddedStore::open(opts).expect("open")
}

async fn set(db: &EmbeddedStore, key: &[u8], value: &[u8]) {
    let tx = db.create_transaction(&TxOptions::write()).await.expect("tx");
    tx.set(key, value);
    tx.commit().await.expect("commit");
}

/// 200 changes written through handle `b`, each watched through `a`; the
/// writes come in pairs (a write of another key right after the watched
/// one, so that the kernel merges their events) and some with no pause
/// at all. Every watch must fire.
async fn every_change_fires(wal_notify: bool) {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let a = open(dir.path(), wal_notify);
    let b = open(dir.path(), wal_notify);
    for i in 0u32..200 {
        let w = run(&*a, TxOptions::read(), |tx| async move { Ok(tx.watch(b"k")) }).await.expect("watch");
        if i % 3 != 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        set(&b, b"k", &i.to_be_bytes()).await;
        set(&b, b"other", &i.to_be_bytes()).await;
        match tokio::time::timeout(Duration::from_secs(3), w).await {
            Ok(r) => r.expect("the watch fires"),
            Err(_) => panic!("change {i} (wal_notify {wal_notify}) did not fire its watch within 3 s"),
        }
    }
    a.close();
    b.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_of_another_handle_fires_with_wal_notifications() {
    every_change_fires(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_of_another_handle_fires_when_polling() {
    every_change_fires(false).await;
}

/// Thread ids of this process named `name`.
fn tids(name: &str) -> HashSet<String> {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task (Linux)")
        .filter_map(|t| t.ok())
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .map(|t| t.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Voluntary context switches of thread `tid` so far: one per sleep.
fn wakeups(tid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).expect("thread status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("voluntary_ctxt_switches")
}

/// Opens a store and returns it with its own watcher thread's id.
fn open_with_watcher(dir: &std::path::Path, wal_notify: bool) -> (Arc<EmbeddedStore>, String) {
    let before = tids("cw-embed-watch");
    let db = open(dir, wal_notify);
    // A thread names itself once it runs: wait for the name.
    let started = std::time::Instant::now();
    loop {
        let mut new: Vec<String> = tids("cw-embed-watch").difference(&before).cloned().collect();
        if new.len() == 1 {
            return (db, new.remove(0));
        }
        assert!(new.len() < 2, "one new watcher thread (other tests of this binary open none while this runs)");
        assert!(started.elapsed() < Duration::from_secs(5), "the store's watcher thread did not start");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// With a watch pending and nothing written, the watcher thread sleeps:
/// with notifications it wakes at most for its safety look (every 10 s by
/// default, `EmbeddedOptions::safety_look`);
/// polling (every 4 ms once idle) it wakes hundreds of times. The second
/// half shows that the count measures wake-ups at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_store_does_not_wake_the_watcher() {
    let _serial = SERIAL.lock().await;
    let span = Duration::from_secs(2);
    let mut seen = Vec::new();
    for wal_notify in [true, false] {
        let dir = tempfile::tempdir().expect("temp dir");
        let (db, tid) = open_with_watcher(dir.path(), wal_notify);
        let w = run(&*db, TxOptions::read(), |tx| async move { Ok(tx.watch(b"k")) }).await.expect("watch");
        // Past the settle window of the store's own setup writes.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = wakeups(&tid);
        tokio::time::sleep(span).await;
        let woke = wakeups(&tid) - before;
        eprintln!("watcher wake-ups over {span:?} with one pending watch, no writes, wal_notify {wal_notify}: {woke}");
        seen.push(woke);
        drop(w);
        db.close();
    }
    assert!(seen[0] <= 6, "with WAL notifications a quiet store wakes the watcher only for its safety check: {seen:?}");
    assert!(seen[1] >= 100, "polling wakes it every few ms: {seen:?}");
}

/// A handle's own commits never wake its watcher thread (they reach it
/// directly, and only when they write a watched key): with a watch
/// pending on a key nobody writes, 200 commits through the same handle
/// leave the thread asleep but for its safety look (10 s by default), while
/// every one of them is sent to the other handle. (With inotify on the WAL
/// each of them woke it: inotify cannot tell whose write it reports.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_commits_do_not_wake_the_watcher() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let (a, tid) = open_with_watcher(dir.path(), true);
    let b = open(dir.path(), true);
    assert!(a.wake_stats().listening && b.wake_stats().listening, "{:?} {:?}", a.wake_stats(), b.wake_stats());
    let w = run(&*a, TxOptions::read(), |tx| async move { Ok(tx.watch(b"never_written")) }).await.expect("watch");
    // Past the registration's look.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = wakeups(&tid);
    let started = std::time::Instant::now();
    let commits = 200u32;
    for i in 0..commits {
        set(&a, b"other", &i.to_be_bytes()).await;
    }
    let woke = wakeups(&tid) - before;
    let span = started.elapsed();
    let (sa, sb) = (a.wake_stats(), b.wake_stats());
    eprintln!("{commits} own commits in {span:?}: watcher wake-ups {woke}; a {sa:?}; b {sb:?}");
    // At most one safety look per second (it is every 10 s by default),
    // plus one for the second begun.
    let allowed = span.as_secs() + 2;
    assert!(woke <= allowed, "the watcher woke {woke} times for {commits} of its own commits (allowed {allowed})");
    assert_eq!(sa.received, 0, "a received nothing: its commits are not sent to itself");
    assert_eq!(sa.sent + sa.dropped, u64::from(commits), "each commit was sent to b: {sa:?}");
    // b's watcher thread counts what it drains, on its own time.
    let waited = std::time::Instant::now();
    while b.wake_stats().received == 0 && waited.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let sb = b.wake_stats();
    assert!(sb.received >= 1 && sb.sent == 0, "b was woken and sent nothing: {sb:?} (a: {sa:?})");
    drop(w);
    a.close();
    b.close();
}

/// The tests of this binary run one at a time (one counts threads).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A node with nothing registered writes nothing to the embedded store: its
/// reaper's passes prove the store writable with empty write transactions
/// (the `reaper_pulse` add is for stores whose versions move only with
/// commits). A write every pass would wake every node's watcher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_node_writes_nothing_to_the_embedded_store() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open(dir.path(), true);
    let log: Arc<dyn couch_workers_core::log::Sink> = Arc::new(couch_workers_core::log::Discard);
    let node = couch_workers_core::Node::with_db(store.clone(), couch_workers_core::Settings::default(), log);
    // The reaper's first passes (500 ms apart at most), after start-up.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = store.sqlite_commits();
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let commits = store.sqlite_commits() - before;
    assert_eq!(commits, 0, "an idle node committed {commits} writes in 1.6 s");
    assert!(node.stats().reapers >= 1, "the reaper runs: {:?}", node.stats());
    node.stop().await;
    store.close();
}
