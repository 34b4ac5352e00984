//! Real disk faults under the embedded store: a disk that fills, store
//! files that turn read-only, a store directory on a read-only mount, and
//! the store's file locked by another process. Nothing is simulated: the
//! kernel refuses the writes (ENOSPC, EPERM, EROFS) or SQLite's own file
//! locks hold them off.
//!
//! Mounting needs root (CAP_SYS_ADMIN); the immutable attribute needs a
//! file system that enforces it on open files (ext4, xfs, btrfs): those
//! three tests are ignored by a plain `cargo test` and run by
//! `scripts/test.sh` as root (`-- --ignored`), where a fault that cannot
//! be made fails the test. Every mount and attribute is undone by a
//! guard, also when an assertion fails.
//!
//! In each test a node runs on the store with a capturing log, and the
//! same story is told: what was committed before the fault; writes during
//! the fault answer an error, at once or within the transaction timeout,
//! never hang; reads keep working; heartbeats keep retrying and log
//! `heartbeat_failed`; the fault is cleared *without reopening the store*
//! and everything works again; nothing committed before is lost and the
//! key space's invariants hold.

mod faults_common;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use couch_workers_core::jobs::{JobHandle, JobService, JobState};
use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore, FILE_NAME};
use couch_workers_core::store::{run, Database, Db, StoreError, TxOptions};
use couch_workers_core::workers::{self, WorkerSpec};
use couch_workers_core::{Error, Node, Settings};
use faults_common::lock::{self, LockHolder};
use faults_common::*;

const T: &[u8] = b"replicator";

/// Longest any single call may take before it counts as a hang.
const CALL_LIMIT: Duration = Duration::from_secs(4);

fn settings(tx_timeout: Duration) -> Settings {
    Settings { tx_timeout, reaper_max_interval: Duration::from_millis(200), ..Settings::default() }
}

fn spec(id: &str, timeout_s: u64) -> WorkerSpec {
    WorkerSpec { worker_type: T.to_vec(), id: id.as_bytes().to_vec(), options_json: b"{}".to_vec(), timeout_s }
}

/// These tests need root (mount, chattr), so they are `#[ignore]`d: a
/// plain `cargo test` reports them as ignored, never as passed.
/// `scripts/test.sh` runs them with `--include-ignored` when it is root;
/// asked for where the fault cannot be made, a test fails and says why.
fn cannot_run(test: &str, why: &str) -> ! {
    panic!("{test} cannot make its fault here: {why}");
}

/// `f` within [`CALL_LIMIT`], or a failed test that names the call.
async fn answer<F: std::future::Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(CALL_LIMIT, f).await {
        Ok(out) => out,
        Err(_) => panic!("{what} did not answer within {CALL_LIMIT:?} (a hang)"),
    }
}

fn is_store_io(e: &Error, needle: &str) -> bool {
    matches!(e, Error::Store(StoreError::Io(msg)) if msg.contains(needle))
}

/// What the tests commit before the fault, to check afterwards.
struct Before {
    pending: Vec<Vec<u8>>,
    running: JobHandle,
    finished: Vec<u8>,
}

/// Adds six jobs, takes two for `worker`, finishes one.
async fn commit_before(jobs: &JobService, worker: &[u8]) -> Before {
    for i in 0..6 {
        jobs.add(T, format!("before-{i}").as_bytes(), b"{\"n\":1}", 0).await.expect("add before the fault");
    }
    let done = jobs.accept(T, worker, Duration::ZERO).await.expect("accept");
    jobs.finish(&done.fence(), b"{\"ok\":true}").await.expect("finish");
    let running = jobs.accept(T, worker, Duration::ZERO).await.expect("accept");
    let pending = (2..6).map(|i| format!("before-{i}").into_bytes()).collect();
    Before { pending, running, finished: done.job.id }
}

/// The jobs of `before` are all there, in their states; the invariants hold.
async fn check_before(node: &Node, before: &Before, when: &str) {
    let snap = snapshot(node.db().as_ref(), node.keyspace()).await;
    snap.assert_ok(when);
    for id in &before.pending {
        let rec = snap.record(T, id).unwrap_or_else(|| panic!("{when}: job {} lost", String::from_utf8_lossy(id)));
        assert_eq!(rec.state, "pending", "{when}");
    }
    let rec = snap.record(T, &before.running.job.id).expect("the running job is there");
    assert_eq!(rec.state, "running", "{when}");
    assert_eq!(rec.token.as_deref(), Some(&before.running.token[..]), "{when}: the same accept holds it");
    assert_eq!(snap.record(T, &before.finished).map(|r| r.state.as_str()), Some("finished"), "{when}");
}

/// After the node has stopped: SQLite's own check of the file (run by a
/// plain connection, as an operator would), then a fresh open of the store
/// that still finds everything of `before` (the running job now pending or
/// finished, whatever the test did with it).
async fn reopen_and_check(dir: &Path, before: &Before, when: &str) {
    let path = dir.join(FILE_NAME);
    let conn = rusqlite::Connection::open(&path).expect("open the file");
    let check: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0)).expect("integrity_check");
    assert_eq!(check, "ok", "{when}: SQLite's integrity check");
    drop(conn);
    let store = EmbeddedStore::open(EmbeddedOptions::new(dir)).expect("reopen the store");
    let db: Db = store.clone();
    let ks = couch_workers_core::keyspace::Keyspace::new(&db.prefix());
    let snap = snapshot(db.as_ref(), &ks).await;
    snap.assert_ok(when);
    for id in before.pending.iter().chain([&before.finished, &before.running.job.id]) {
        assert!(snap.record(T, id).is_some(), "{when}: job {} lost", String::from_utf8_lossy(id));
    }
    store.close();
}

// ---- a disk that fills ----------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root (mount, chattr): scripts/test.sh runs it with --include-ignored as root"]
async fn disk_full_fails_writes_keeps_reads_and_recovers_when_space_is_freed() {
    count_panics();
    let tmp = tempfile::tempdir().expect("temp dir");
    let fs = match Tmpfs::mount(&tmp.path().join("fs"), 4 * 1024 * 1024) {
        Ok(fs) => fs,
        Err(e) => cannot_run("disk_full", &format!("cannot mount a small tmpfs ({e}); needs root / CAP_SYS_ADMIN")),
    };
    let log = CaptureLog::new();
    let store = EmbeddedStore::open(EmbeddedOptions::new(fs.path.join("store"))).expect("open the store");
    let node = Node::with_db(store.clone(), settings(Duration::from_secs(1)), log.clone());
    let jobs = node.jobs();
    let reg = node.register_worker(spec("w1", 3)).await.expect("register");
    let before = commit_before(jobs, b"w1").await;

    let filled = fill(&fs.path.join("filler"));
    eprintln!("disk_full: filled the 4 MiB tmpfs with {} KiB", filled / 1024);

    // Writes fail with a clear error. The WAL may still have room in pages
    // it already holds, so write until the file system refuses (bounded).
    let big_info = format!("{{\"pad\":\"{}\"}}", "x".repeat(60_000)).into_bytes();
    let started = Instant::now();
    let mut first_error = None;
    let mut written_during = Vec::new();
    for i in 0..200 {
        let id = format!("during-{i}").into_bytes();
        match answer("add on a full disk", jobs.add(T, &id, &big_info, 0)).await {
            Ok(()) => written_during.push(id),
            Err(e) => {
                first_error = Some((id, e));
                break;
            }
        }
    }
    let (failed_id, err) = first_error.expect("a write fails once the disk is full");
    eprintln!(
        "disk_full: first refused write after {} accepted ones, {:?}: {err}",
        written_during.len(),
        started.elapsed()
    );
    // Every kind of write is refused the same way, and answers at once.
    // A small write can still fit in the space the WAL file already holds
    // (the refused write's frames allocated it; SQLite writes into it
    // again): such writes succeed and are kept, so each kind is written
    // until the file system refuses it (bounded).
    let t0 = Instant::now();
    let mut registered_during = Vec::new();
    let mut refusals = Vec::new();
    for i in 0..1_000 {
        let id = format!("small-{i}").into_bytes();
        match answer("small add on a full disk", jobs.add(T, &id, b"{}", 0)).await {
            Ok(()) => written_during.push(id),
            Err(e) => {
                refusals.push(("small add", e));
                break;
            }
        }
    }
    for i in 2..1_000 {
        match answer("register on a full disk", node.register_worker(spec(&format!("w{i}"), 3))).await {
            Ok(r) => registered_during.push(r),
            Err(e) => {
                refusals.push(("register", e));
                break;
            }
        }
    }
    let r = answer("add on a full disk", jobs.add(T, b"during-again", &big_info, 0)).await;
    refusals.extend(r.err().map(|e| ("the same big add", e)));
    assert_eq!(refusals.len(), 3, "every kind of write refused: {refusals:?}");
    for (what, e) in &refusals {
        assert!(is_store_io(e, "disk full"), "{what}: a clear disk-full error, got {e:?}");
    }
    assert!(t0.elapsed() < Duration::from_secs(1), "I/O errors are not retried: {:?}", t0.elapsed());
    eprintln!(
        "disk_full: then {} small adds and {} registrations fitted before refusals",
        written_during.len(),
        registered_during.len()
    );

    // Reads still work.
    let job = answer("get", jobs.get(T, &before.pending[0])).await.expect("read on a full disk");
    assert_eq!(job.state, JobState::Pending);
    assert_eq!(answer("get", jobs.get(T, &failed_id)).await, Err(Error::NotFound), "a refused add left nothing");
    assert!(answer("count", jobs.pending_count(T)).await.expect("count") >= 4);
    let ks = node.keyspace().clone();
    let members = run(node.db().as_ref(), TxOptions::read(), |tx| {
        let ks = ks.clone();
        async move { workers::read_membership(&tx, &ks, T).await }
    })
    .await
    .expect("membership read on a full disk");
    assert_eq!(members.workers.len(), 1 + registered_during.len());

    // The heartbeat fails and says why; it keeps trying (it recovers, as
    // `heartbeat_recovered`, without being registered again). One failure
    // is waited for, not more: the worker must not reach its timeout.
    let failed = log.wait_for("heartbeat_failed", 1, Duration::from_secs(3)).await.expect("heartbeat_failed");
    let reason = field(&failed, "reason").unwrap_or_default();
    assert!(reason.contains("disk full"), "heartbeat_failed says why: {reason}");

    // Free the space: everything recovers, without reopening the store.
    std::fs::remove_file(fs.path.join("filler")).expect("free the space");
    let t0 = Instant::now();
    answer("add after freeing space", jobs.add(T, &failed_id, &big_info, 0)).await.expect("writes work again");
    // A fresh id: the ids registered during the fault are still held by
    // their registrations, and registering one of them again would replace
    // it (a new incarnation), so that its failing heartbeat would end as
    // `worker_superseded` instead of recovering.
    let _after =
        answer("register after", node.register_worker(spec("w-after", 3))).await.expect("register works again");
    log.wait_for("heartbeat_recovered", 1, Duration::from_secs(3)).await.expect("the heartbeat recovers");
    eprintln!("disk_full: recovered {:?} after the space was freed", t0.elapsed());
    assert_eq!(log.count("worker_reaped"), 0, "the worker was never reaped");
    assert_eq!(log.count("worker_reinstated"), 0);
    check_before(&node, &before, "after the disk was full").await;
    // The accept from before the fault still holds its job and can finish.
    answer("finish", jobs.finish(&before.running.fence(), b"{}")).await.expect("finish after recovery");
    for id in &written_during {
        assert!(answer("get", jobs.get(T, id)).await.is_ok(), "an add that answered ok is there");
    }
    snapshot(node.db().as_ref(), node.keyspace()).await.assert_ok("at the end");
    node.unregister_worker(&reg).await.expect("unregister");
    node.stop().await;
    drop(node);
    drop(store);
    reopen_and_check(&fs.path.join("store"), &before, "reopened after the disk was full").await;
    assert_eq!(panics(), 0, "no panic in any background task");
    drop(fs);
}

// ---- store files that turn read-only ------------------------------------

/// The store's file, its WAL and its directory become immutable while the
/// store is open (what `chattr +i` does: the kernel refuses every write to
/// them with EPERM, root's included, also through the store's open file
/// descriptors). `chmod a-w` would prove nothing here: the tests run as
/// root, whom permission bits do not stop, and open descriptors keep their
/// access mode anyway. A read-only *remount* is refused while the store
/// holds its files open for writing (EBUSY): that is tested at open time,
/// below.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root (mount, chattr): scripts/test.sh runs it with --include-ignored as root"]
async fn read_only_files_fail_writes_keep_reads_and_recover() {
    count_panics();
    let tmp = tempfile::tempdir().expect("temp dir");
    if let Err(e) = Immutable::probe(tmp.path()) {
        cannot_run(
            "read_only_files",
            &format!("the immutable attribute cannot be used here ({e}); needs root / CAP_LINUX_IMMUTABLE on ext4, xfs or btrfs"),
        );
    }
    let dir = tmp.path().join("store");
    let log = CaptureLog::new();
    let store = EmbeddedStore::open(EmbeddedOptions::new(&dir)).expect("open the store");
    let node = Node::with_db(store.clone(), settings(Duration::from_secs(1)), log.clone());
    let jobs = node.jobs();
    let reg = node.register_worker(spec("w1", 3)).await.expect("register");
    let before = commit_before(jobs, b"w1").await;

    let files: Vec<_> =
        [FILE_NAME.to_string(), format!("{FILE_NAME}-wal")].iter().map(|f| dir.join(f)).chain([dir.clone()]).collect();
    let mut ro = Immutable::set(&files).expect("chattr +i");
    let t0 = Instant::now();
    let r = answer("add on read-only files", jobs.add(T, b"during", b"{}", 0)).await;
    eprintln!("read_only_files: add answered in {:?}: {r:?}", t0.elapsed());
    let err = r.expect_err("a write to a read-only store fails");
    assert!(matches!(&err, Error::Store(StoreError::Io(_))), "{err:?}");
    let r = answer("register on read-only files", node.register_worker(spec("w2", 3))).await;
    assert!(matches!(&r, Err(Error::Store(StoreError::Io(_)))), "{:?}", r.as_ref().err());
    let r = answer("finish on read-only files", jobs.finish(&before.running.fence(), b"{}")).await;
    assert!(matches!(&r, Err(Error::Store(StoreError::Io(_)))), "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(1), "I/O errors are not retried: {:?}", t0.elapsed());

    let job = answer("get", jobs.get(T, &before.pending[0])).await.expect("reads work on a read-only store");
    assert_eq!(job.state, JobState::Pending);
    assert_eq!(answer("get", jobs.get(T, b"during")).await, Err(Error::NotFound));
    assert_eq!(answer("count", jobs.pending_count(T)).await, Ok(4));

    let failed = log.wait_for("heartbeat_failed", 1, Duration::from_secs(3)).await.expect("heartbeat_failed");
    eprintln!("read_only_files: heartbeat_failed reason: {}", field(&failed, "reason").unwrap_or_default());

    // Readers opened while the files are read-only (more at once than the
    // store keeps idle, so new connections are opened now).
    let held: Vec<_> = {
        let mut v = Vec::new();
        for _ in 0..8 {
            v.push(answer("read tx", store.create_transaction(&TxOptions::read())).await.expect("a reader"));
        }
        v
    };
    for tx in &held {
        assert!(answer("read", tx.get(b"x", false)).await.is_ok());
    }
    drop(held);

    ro.clear();
    // Read-mode transactions that write (they upgrade to the write lock):
    // none may fail on a connection opened while the files were read-only.
    for i in 0u32..16 {
        answer(
            "read-mode write",
            run(store.as_ref(), TxOptions::read(), |tx| async move {
                tx.set(b"upgrade", &i.to_be_bytes());
                Ok(())
            }),
        )
        .await
        .unwrap_or_else(|e| panic!("read-mode write {i} after the fault cleared: {e}"));
    }
    let t0 = Instant::now();
    answer("add after", jobs.add(T, b"during", b"{}", 0)).await.expect("writes work again");
    // A fresh id: the ids registered during the fault are still held by
    // their registrations, and registering one of them again would replace
    // it (a new incarnation), so that its failing heartbeat would end as
    // `worker_superseded` instead of recovering.
    let _after =
        answer("register after", node.register_worker(spec("w-after", 3))).await.expect("register works again");
    log.wait_for("heartbeat_recovered", 1, Duration::from_secs(3)).await.expect("the heartbeat recovers");
    eprintln!("read_only_files: recovered {:?} after the attribute was cleared", t0.elapsed());
    assert_eq!(log.count("worker_reaped"), 0);
    check_before(&node, &before, "after the files were read-only").await;
    answer("finish", jobs.finish(&before.running.fence(), b"{}")).await.expect("finish after recovery");
    node.unregister_worker(&reg).await.expect("unregister");
    snapshot(node.db().as_ref(), node.keyspace()).await.assert_ok("at the end");
    node.stop().await;
    drop(node);
    drop(store);
    reopen_and_check(&dir, &before, "reopened after the files were read-only").await;
    assert_eq!(panics(), 0, "no panic in any background task");
}

/// The store's directory on a read-only mount when a node opens it (a
/// bind mount remounted read-only: the kernel answers EROFS), also while
/// another node keeps writing through a writable path. The open fails at
/// once with the reason; once the mount is writable the same directory
/// opens and holds everything the other node committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root (mount, chattr): scripts/test.sh runs it with --include-ignored as root"]
async fn read_only_mount_refuses_to_open_then_opens_when_writable() {
    count_panics();
    let tmp = tempfile::tempdir().expect("temp dir");
    let src = tmp.path().join("src");
    // A node writes through the writable path.
    let store = EmbeddedStore::open(EmbeddedOptions::new(&src)).expect("open rw");
    let node = Node::with_db(store.clone(), settings(Duration::from_secs(1)), CaptureLog::new());
    let _reg = node.register_worker(spec("w1", 10)).await.expect("register");
    let before = commit_before(node.jobs(), b"w1").await;

    let bind = match BindMount::new(&src, &tmp.path().join("ro")) {
        Ok(b) => b,
        Err(e) => {
            node.stop().await;
            cannot_run("read_only_mount", &format!("cannot bind-mount ({e}); needs root / CAP_SYS_ADMIN"));
        }
    };
    bind.set_read_only(true).expect("remount the bind read-only");
    let t0 = Instant::now();
    let err = EmbeddedStore::open(EmbeddedOptions::new(&bind.target)).expect_err("a read-only store does not open");
    eprintln!("read_only_mount: open answered in {:?}: {err}", t0.elapsed());
    assert!(matches!(&err, StoreError::Io(m) if m.contains("read-only")), "{err:?}");
    assert!(t0.elapsed() < Duration::from_secs(2));
    // The writing node is unaffected.
    node.jobs().add(T, b"while-ro", b"{}", 0).await.expect("the other node writes on");

    // Also with no node open at all (no WAL left behind).
    node.stop().await;
    drop(node);
    drop(store);
    let err = EmbeddedStore::open(EmbeddedOptions::new(&bind.target)).expect_err("still read-only");
    assert!(matches!(&err, StoreError::Io(m) if m.contains("read-only")), "{err:?}");

    bind.set_read_only(false).expect("remount the bind writable");
    let store = EmbeddedStore::open(EmbeddedOptions::new(&bind.target)).expect("opens once writable");
    let node = Node::with_db(store.clone(), settings(Duration::from_secs(1)), CaptureLog::new());
    node.jobs().add(T, b"after", b"{}", 0).await.expect("writes");
    check_before(&node, &before, "after the mount was read-only").await;
    assert_eq!(node.jobs().get(T, b"while-ro").await.map(|j| j.state), Ok(JobState::Pending));
    node.stop().await;
    drop(node);
    drop(store);
    assert_eq!(panics(), 0, "no panic in any background task");
    drop(bind);
}

// ---- the store's file locked by another process --------------------------

/// The test a lock holder re-executes (see `faults_common::lock`).
const LOCK_TEST: &str = "store_locked_by_another_process_times_out_then_recovers";

async fn raw_get(db: &Db, key: &[u8]) -> Option<Vec<u8>> {
    run(db.as_ref(), TxOptions::read(), |tx| async move { tx.get(key, false).await }).await.expect("read")
}

fn is_lock_timeout(e: &Error) -> bool {
    matches!(e, Error::Store(StoreError::TimedOut | StoreError::Busy))
        || matches!(e, Error::Store(StoreError::RetryLimit { last, .. }) if matches!(**last, StoreError::Busy))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_locked_by_another_process_times_out_then_recovers() {
    if lock::serve_if_holder() {
        return;
    }
    count_panics();
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    let log = CaptureLog::new();
    let tx_timeout = Duration::from_millis(500);
    let store = EmbeddedStore::open(EmbeddedOptions::new(&dir)).expect("open the store");
    let db: Db = store.clone();
    let node = Node::with_db(db.clone(), settings(tx_timeout), log.clone());
    let jobs = node.jobs();
    // Timeout 3 s: a heartbeat every second, so one fails while the lock
    // is held, and the worker is not reaped meanwhile.
    let reg = node.register_worker(spec("w1", 3)).await.expect("register");
    let before = commit_before(jobs, b"w1").await;
    let started = Instant::now();

    // 1. A writer of another process holds the write lock, then commits.
    let holder = LockHolder::spawn(LOCK_TEST, &dir, "immediate", "committed");
    let t0 = Instant::now();
    let err = answer("add while locked", jobs.add(T, b"during", b"{}", 0)).await.expect_err("no write while locked");
    let waited = t0.elapsed();
    eprintln!("locked: add answered after {waited:?}: {err}");
    assert!(is_lock_timeout(&err), "a clear lock timeout, got {err:?}");
    assert!(waited >= tx_timeout.mul_f64(0.9) && waited < tx_timeout * 3, "waited {waited:?}");
    // Reads go on (WAL readers do not wait for writers).
    let t0 = Instant::now();
    assert_eq!(
        answer("get while locked", jobs.get(T, &before.pending[0])).await.map(|j| j.state),
        Ok(JobState::Pending)
    );
    assert_eq!(answer("count while locked", jobs.pending_count(T)).await, Ok(4));
    // Reads that waited for the lock would wait out the 500 ms budget.
    assert!(t0.elapsed() < Duration::from_millis(450), "reads did not wait: {:?}", t0.elapsed());
    let failed = log.wait_for("heartbeat_failed", 1, Duration::from_secs(3)).await.expect("heartbeat_failed");
    eprintln!("locked: heartbeat_failed: {}", field(&failed, "reason").unwrap_or_default());
    holder.release("commit");
    let t0 = Instant::now();
    answer("add after", jobs.add(T, b"during", b"{}", 0)).await.expect("writes work again");
    eprintln!("locked: first write {:?} after the release", t0.elapsed());
    assert_eq!(
        raw_get(&db, b"locker/committed").await.as_deref(),
        Some(&b"1"[..]),
        "the other process's commit is seen"
    );
    log.wait_for("heartbeat_recovered", 1, Duration::from_secs(3)).await.expect("the heartbeat recovers");

    // 2. The holder is killed (kill -9) in the middle of its transaction.
    let holder = LockHolder::spawn(LOCK_TEST, &dir, "immediate", "killed");
    let err = answer("add while locked", jobs.add(T, b"during-2", b"{}", 0)).await.expect_err("no write while locked");
    assert!(is_lock_timeout(&err), "{err:?}");
    holder.kill();
    answer("add after kill", jobs.add(T, b"during-2", b"{}", 0)).await.expect("writes work after the holder died");
    assert_eq!(raw_get(&db, b"locker/killed").await, None, "the killed holder's write never committed");

    // 3. A node (re)starts while another process holds the lock: the
    //    store opens at once (an already set-up store is opened without
    //    writing), reads work through it, its writes wait and time out,
    //    then go through once the lock is released.
    let holder = LockHolder::spawn(LOCK_TEST, &dir, "immediate", "at-open");
    let t0 = Instant::now();
    let second = EmbeddedStore::open(EmbeddedOptions::new(&dir)).expect("opens while another process writes");
    assert!(t0.elapsed() < Duration::from_secs(1), "open did not wait for the lock: {:?}", t0.elapsed());
    let second_db: Db = second.clone();
    assert!(raw_get(&second_db, b"locker/committed").await.is_some(), "reads work through the new handle");
    let opts = TxOptions { timeout: tx_timeout, ..TxOptions::write() };
    let r = answer(
        "write through the new handle",
        run(second_db.as_ref(), opts, |tx| async move {
            tx.set(b"second", b"1");
            Ok(())
        }),
    )
    .await;
    assert!(matches!(r, Err(StoreError::TimedOut | StoreError::Busy)), "{r:?}");
    holder.release("rollback");
    answer(
        "write after the release",
        run(second_db.as_ref(), opts, |tx| async move {
            tx.set(b"second", b"1");
            Ok(())
        }),
    )
    .await
    .expect("the new handle writes once the lock is free");
    assert_eq!(raw_get(&db, b"locker/at-open").await, None, "the rolled-back write is not there");
    second.close();

    // SQLite's `locking_mode=EXCLUSIVE` (which would lock readers out
    // too) cannot be taken by another process while a node has the store
    // open: every WAL connection holds a shared lock on the file, so the
    // taker gets SQLITE_BUSY. Checked here, since it bounds what "locked
    // by another process" can mean.
    let mut child = lock::holder_command(LOCK_TEST, &dir, "exclusive", "exclusive")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn");
    // Reads and writes go on meanwhile.
    answer("add while another process tries an exclusive lock", jobs.add(T, b"during-3", b"{}", 0))
        .await
        .expect("writes go on");
    let out = tokio::task::spawn_blocking(move || {
        let mut out = String::new();
        let _ = std::io::Read::read_to_string(child.stdout.as_mut().expect("stdout"), &mut out);
        let _ = child.wait();
        out
    })
    .await
    .expect("the exclusive taker's output");
    assert!(out.contains("LOCK-FAILED"), "an exclusive lock was refused while the store is open:\n{out}");
    assert_eq!(raw_get(&db, b"locker/exclusive").await, None);
    eprintln!("locked: three lock holders and an exclusive-lock attempt in {:?}", started.elapsed());

    assert_eq!(log.count("worker_reaped"), 0, "the worker was never reaped");
    check_before(&node, &before, "after the locks").await;
    answer("finish", jobs.finish(&before.running.fence(), b"{}"))
        .await
        .expect("the accept from before still holds its job");
    node.unregister_worker(&reg).await.expect("unregister");
    node.stop().await;
    drop(node);
    drop(db);
    drop(store);
    reopen_and_check(&dir, &before, "reopened after the locks").await;
    assert_eq!(panics(), 0, "no panic in any background task");
}
