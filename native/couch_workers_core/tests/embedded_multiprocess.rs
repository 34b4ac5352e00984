//! The embedded store shared by real OS processes, as Erlang nodes on one
//! host share it. Each test re-executes this test binary
//! (`current_exe --exact <test>`) with `CW_MP_ROLE` set: the same test
//! function then plays the child's part and asserts its own side.

use std::path::Path;
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::{run, Database, RangeRequest, TxOptions, VERSIONSTAMP_LEN};

mod child_common;

const ROLE: &str = "CW_MP_ROLE";
const DIR: &str = "CW_MP_DIR";
const ID: &str = "CW_MP_ID";
/// How long each process increments, back to back, after the go.
const BURST: Duration = Duration::from_millis(300);

fn wall_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

/// Re-executes this binary to run `test` as a child with `role`.
fn spawn_child(test: &str, role: &str, dir: &Path, id: u8) -> Child {
    let id = id.to_string();
    child_common::spawn(test, &[(ROLE, role.as_ref()), (DIR, dir.as_os_str()), (ID, id.as_ref())])
}

fn wait_child(child: Child, what: &str) {
    child_common::wait(child, what);
}

fn key_n(prefix: &[u8], n: u64) -> Vec<u8> {
    [prefix, &n.to_be_bytes()].concat()
}

/// One increment: read the counter, write counter + 1 and a log entry for
/// the old value whose value is `[id] ++ commit versionstamp`.
async fn increment(db: &EmbeddedStore, id: u8) -> u64 {
    // Not `run`: it would hide the version. Write mode waits for the lock
    // and never conflicts, so one attempt is enough.
    let tx = match db.create_transaction(&TxOptions::write()).await {
        Ok(tx) => tx,
        Err(e) => panic!("process {id}: cannot begin: {e}"),
    };
    let n = tx
        .get(b"mp/counter", false)
        .await
        .expect("read counter")
        .map(|v| u64::from_be_bytes(v.as_slice().try_into().expect("8 bytes")))
        .unwrap_or(0);
    tx.set(b"mp/counter", &(n + 1).to_be_bytes());
    let mut value = vec![id];
    value.extend_from_slice(&[0xff; VERSIONSTAMP_LEN]);
    value.extend_from_slice(&1u32.to_le_bytes());
    tx.set_versionstamped_value(&key_n(b"mp/log/", n), &value);
    tx.commit().await.expect("commit").version.expect("version")
}

async fn child_increments(dir: &Path, id: u8) {
    let db = EmbeddedStore::open(EmbeddedOptions::new(dir)).expect("child opens the store");
    let tx = db.create_transaction(&TxOptions::write()).await.expect("tx");
    tx.set(&[b"mp/hello/".as_slice(), &[id]].concat(), &wall_us().to_be_bytes());
    tx.commit().await.expect("hello");
    // Start together with the others: wait for the parent's go.
    let started = Instant::now();
    loop {
        let (go, w) =
            run(&*db, TxOptions::read(), |tx| async move { Ok((tx.get(b"mp/go", false).await?, tx.watch(b"mp/go"))) })
                .await
                .expect("read go");
        if go.is_some() {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "child {id}: no go");
        let _ = tokio::time::timeout(Duration::from_millis(500), w).await;
    }
    burst(&db, id).await;
}

/// Four tasks increment back to back for [`BURST`] (so this process's
/// writers hand the lock to each other without a gap); returns the longest
/// wait for one increment.
async fn burst(db: &Arc<EmbeddedStore>, id: u8) -> Duration {
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let db = db.clone();
            tokio::spawn(async move { burst_task(&db, id).await })
        })
        .collect();
    let mut longest = Duration::ZERO;
    for task in tasks {
        longest = longest.max(task.await.expect("burst task"));
    }
    longest
}

async fn burst_task(db: &EmbeddedStore, id: u8) -> Duration {
    let started = Instant::now();
    let mut last = 0;
    let mut longest = Duration::ZERO;
    while started.elapsed() < BURST {
        let one = Instant::now();
        let v = increment(db, id).await;
        longest = longest.max(one.elapsed());
        assert!(v > last, "process {id}: version {v} after {last}");
        last = v;
    }
    longest
}

async fn child_loops_forever(dir: &Path, id: u8) {
    let db = EmbeddedStore::open(EmbeddedOptions::new(dir)).expect("child opens the store");
    loop {
        increment(&db, id).await;
    }
}

/// Checks the log written by [`increment`]: one entry per increment, and
/// the commit versions strictly increase in counter order, whichever
/// process committed.
async fn check_log(db: &EmbeddedStore) -> (u64, Vec<u8>) {
    let counter = run(db, TxOptions::read(), |tx| async move { tx.get(b"mp/counter", false).await })
        .await
        .expect("counter")
        .map(|v| u64::from_be_bytes(v.as_slice().try_into().expect("8 bytes")))
        .unwrap_or(0);
    let log = run(db, TxOptions::read(), |tx| async move { tx.get_range(&RangeRequest::prefix(b"mp/log/")).await })
        .await
        .expect("log");
    assert_eq!(log.len() as u64, counter, "one log entry per increment");
    let mut last = [0u8; VERSIONSTAMP_LEN];
    let mut writers = Vec::new();
    for (n, (k, v)) in log.iter().enumerate() {
        assert_eq!(k, &key_n(b"mp/log/", n as u64));
        let stamp: [u8; VERSIONSTAMP_LEN] = v[1..].try_into().expect("stamp");
        assert!(stamp > last, "entry {n}: stamp {stamp:02x?} not after {last:02x?}");
        last = stamp;
        writers.push(v[0]);
    }
    (counter, writers)
}

#[tokio::test(flavor = "multi_thread")]
async fn processes_share_one_serializable_store() {
    if let Ok(role) = std::env::var(ROLE) {
        let dir = std::env::var(DIR).expect("child dir");
        let id: u8 = std::env::var(ID).expect("child id").parse().expect("id");
        assert_eq!(role, "increments");
        child_increments(Path::new(&dir), id).await;
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let db = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open");
    // Watch for the first child's hello before any child exists.
    let hello = run(&*db, TxOptions::read(), |tx| async move { Ok(tx.watch(b"mp/hello/\x01")) }).await.expect("watch");
    let hello = tokio::spawn(async move { (hello.await, wall_us()) });
    let started = Instant::now();
    let children =
        [1u8, 2].map(|id| spawn_child("processes_share_one_serializable_store", "increments", dir.path(), id));
    let (fired, fired_at) = tokio::time::timeout(Duration::from_secs(10), hello)
        .await
        .expect("the watch fires for another process's commit")
        .expect("task");
    assert_eq!(fired, Ok(()));
    // Both children are ready: go.
    loop {
        let ready =
            run(&*db, TxOptions::read(), |tx| async move { tx.get_range(&RangeRequest::prefix(b"mp/hello/")).await })
                .await
                .expect("hellos");
        if ready.len() == 2 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "children not ready");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let go = Instant::now();
    let tx = db.create_transaction(&TxOptions::write()).await.expect("tx");
    tx.set(b"mp/go", b"");
    tx.commit().await.expect("go");
    let longest = burst(&db, 0).await;
    for (i, child) in children.into_iter().enumerate() {
        wait_child(child, &format!("child {}", i + 1));
    }
    let took = go.elapsed();
    let written_at = run(&*db, TxOptions::read(), |tx| async move { tx.get(b"mp/hello/\x01", false).await })
        .await
        .expect("hello")
        .map(|v| u64::from_be_bytes(v.as_slice().try_into().expect("8 bytes")))
        .expect("hello written");
    let (counter, writers) = check_log(&db).await;
    // Every process got a fair share of the lock (no one starves while
    // another writes back to back): at least a seventh of an equal share
    // (loose: CI machines are noisy), and the lock changed hands many times.
    let shares: Vec<usize> = (0..3u8).map(|id| writers.iter().filter(|&&w| w == id).count()).collect();
    let switches = writers.windows(2).filter(|w| w[0] != w[1]).count();
    eprintln!(
        "3 processes, {BURST:?} bursts: {counter} increments in {took:?}, shares {shares:?}, \
         {switches} writer switches, parent's longest wait {longest:?}; \
         cross-process watch latency ~{} us",
        fired_at.saturating_sub(written_at)
    );
    // Fairness is judged where all three competed: from the last process's
    // first write to the first process's last. A process the loaded machine
    // started late (CI once saw shares [153, 131, 8]) has a short window,
    // not a starved one; a starved process writes only after the others'
    // bursts, which leaves no window at all.
    let first = (0..3u8).map(|id| writers.iter().position(|&w| w == id).expect("every process wrote")).max().unwrap();
    let last = (0..3u8).map(|id| writers.iter().rposition(|&w| w == id).unwrap()).min().unwrap();
    assert!(first < last, "no process wrote while all three competed (shares {shares:?}): one waited out the others");
    let window = &writers[first..=last];
    for id in 0..3u8 {
        let share = window.iter().filter(|&&w| w == id).count();
        assert!(
            share * 20 >= window.len(),
            "process {id} starved: {share} of the {} writes while all competed",
            window.len()
        );
    }
    assert!(switches >= 20, "writers barely interleave: {switches} switches");
    // Versions after every child's commits are still above theirs.
    let last = check_log(&db).await.1.len();
    increment(&db, 0).await;
    assert_eq!(check_log(&db).await.1.len(), last + 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_process_leaves_a_consistent_usable_store() {
    if let Ok(role) = std::env::var(ROLE) {
        let dir = std::env::var(DIR).expect("child dir");
        assert_eq!(role, "loop");
        child_loops_forever(Path::new(&dir), 9).await;
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let db: Arc<EmbeddedStore> = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open");
    let mut child = spawn_child("a_killed_process_leaves_a_consistent_usable_store", "loop", dir.path(), 9);
    // Wait until the child has committed a good number of increments.
    let started = Instant::now();
    loop {
        let w = run(&*db, TxOptions::read(), |tx| async move {
            let n = tx.get(b"mp/counter", false).await?;
            Ok((n, tx.watch(b"mp/counter")))
        })
        .await
        .expect("read");
        if let Some(n) = w.0 {
            if u64::from_be_bytes(n.as_slice().try_into().expect("8 bytes")) >= 200 {
                break;
            }
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the child does not commit");
        let _ = tokio::time::timeout(Duration::from_millis(200), w.1).await;
    }
    // SIGKILL, most likely in the middle of a transaction holding the lock.
    child.kill().expect("kill -9 the child");
    let _ = child.wait();
    let before = check_log(&db).await.0;
    let started = Instant::now();
    increment(&db, 0).await;
    // (A lock left held would make the write wait out its 5 s budget.)
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the dead process's lock is free at once: {:?}",
        started.elapsed()
    );
    let (after, writers) = check_log(&db).await;
    assert_eq!(after, before + 1);
    assert_eq!(writers.last(), Some(&0));
    // And a fresh handle (a restarted node) opens it fine.
    let db2 = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("reopen");
    increment(&db2, 0).await;
    assert_eq!(check_log(&db2).await.0, before + 2);
}
