//! The failure detector never reaps a live worker for the store's sake:
//! not while another OS process holds the embedded store's
//! SQLite write lock for several of the worker's timeouts (no heartbeat
//! can commit, the store's versions run on), and not when the store's
//! versions jump by 100 s as at every FoundationDB recovery. A worker
//! whose node really died is still reaped within its timeout plus 1 s.
//! The recovery also runs on the sim store, where it is FoundationDB's
//! (lost commits, failed watches, too-old transactions, the jump).
//!
//! The stall and jump tests run four nodes, each with its own reaper:
//! node A holds the worker and its running job, nodes B, C and D only
//! reap (three other nodes of a cluster, racing A's heartbeat for the
//! store once it takes writes again). Afterwards the worker must still be
//! A's registration (the same incarnation, never reaped nor reinstated)
//! and its job's handle must still finish the job.
//!
//! The quiet-cluster tests (`quiet_cluster::*`) kill node A of a cluster
//! where nothing commits but the nodes, whose read versions then move in
//! lumps, with 1 or 3 other nodes and timeouts of 4 s and 15 s: A's worker
//! must leave within its timeout plus 1 s, B's own never. They run on the
//! sim store and, with `--features fdb` and `FDB_CLUSTER_FILE`, on a live
//! FoundationDB cluster (see the `fdb` module below).

mod faults_common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use couch_workers_core::jobs::JobState;
use couch_workers_core::keyspace::Keyspace;
use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::sim::{Latency, SimFaults, SimOptions, SimStore, RECOVERY_VERSION_JUMP};
use couch_workers_core::store::{run, Db, TxOptions};
use couch_workers_core::workers::{self, WorkerSpec};
use couch_workers_core::{Node, Registration, Settings};
use faults_common::lock::{self, LockHolder};
use faults_common::*;

const T: &[u8] = b"replicator";

/// The worker's health timeout in the stall and jump tests: the smallest
/// there is, so that the tests are short and a stall is many timeouts
/// long.
const TIMEOUT_S: u64 = 1;

/// The test a lock holder re-executes (see `faults_common::lock`).
const LOCK_ENTRY: &str = "worker_survives_another_process_holding_the_write_lock_for_2x_its_timeout";

/// Reaper-only nodes besides A in the stall and jump tests.
const OTHERS: usize = 3;

fn settings() -> Settings {
    // The app's transaction timeout (5 s): a heartbeat, and a reap, wait
    // that long for the lock.
    Settings { reaper_max_interval: Duration::from_millis(200), ..Settings::default() }
}

/// What a test cluster is made of: the workers' timeout, the node
/// settings, and how many nodes besides A there are (each with its
/// reaper).
#[derive(Clone, Copy)]
struct Shape {
    timeout_s: u64,
    others: usize,
    settings: Settings,
}

/// The stall and jump tests' cluster: 1 s timeouts, four reapers.
fn small_timeout() -> Shape {
    Shape { timeout_s: TIMEOUT_S, others: OTHERS, settings: settings() }
}

fn spec(id: &str, timeout_s: u64) -> WorkerSpec {
    WorkerSpec { worker_type: T.to_vec(), id: id.as_bytes().to_vec(), options_json: b"{}".to_vec(), timeout_s }
}

/// Node A (with worker `w` running job `j`) and `shape.others`
/// reaper-only nodes.
struct Cluster {
    a: Arc<Node>,
    log_a: Arc<CaptureLog>,
    others: Vec<(Arc<Node>, Arc<CaptureLog>)>,
    reg: Registration,
    job: couch_workers_core::jobs::JobHandle,
}

impl Cluster {
    /// `db(i)`: the store handle of node `i` (0 is A).
    async fn start(db: impl Fn(usize) -> Db, shape: Shape) -> Cluster {
        let log_a = CaptureLog::new();
        let a = Node::with_db(db(0), shape.settings, log_a.clone());
        let others = (1..=shape.others)
            .map(|i| {
                let log = CaptureLog::new();
                (Node::with_db(db(i), shape.settings, log.clone()), log)
            })
            .collect();
        let reg = a.register_worker(spec("w", shape.timeout_s)).await.expect("register");
        a.jobs().add(T, b"j", b"{}", 0).await.expect("add");
        let job = a.jobs().accept(T, b"w", Duration::ZERO).await.expect("accept");
        Cluster { a, log_a, others, reg, job }
    }

    fn b(&self) -> &Arc<Node> {
        &self.others[0].0
    }

    /// Events named `what` on every node.
    fn named(&self, what: &str) -> Vec<couch_workers_core::log::Event> {
        let mut all = self.log_a.named(what);
        for (_, log) in &self.others {
            all.extend(log.named(what));
        }
        all
    }

    fn count(&self, what: &str) -> usize {
        self.named(what).len()
    }

    /// The worker is A's registration still, never reaped nor reinstated,
    /// and its job is still running under the same accept.
    async fn assert_never_reaped(&self, when: &str) {
        assert_eq!(self.count("worker_reaped"), 0, "{when}: a live worker was reaped");
        assert_eq!(self.log_a.count("worker_reinstated"), 0, "{when}: the worker had to be reinstated");
        let ks = self.a.keyspace().clone();
        let health = run(self.b().db().as_ref(), TxOptions::read(), |tx| {
            let ks = ks.clone();
            async move { workers::read_health(&tx, &ks, T, b"w").await }
        })
        .await
        .expect("read health");
        assert_eq!(health.and_then(|h| h.incarnation), Some(*self.reg.incarnation()), "{when}: A's registration");
        let job = self.b().jobs().get(T, b"j").await.expect("the job");
        assert_eq!((job.state, job.attempts), (JobState::Running, 1), "{when}: the first accept still runs it");
    }

    async fn stop_others(&self) {
        for (node, _) in &self.others {
            node.stop().await;
        }
    }

    /// Ends the test: the job's handle finishes it, and every node stops.
    async fn finish(self) {
        self.a.jobs().finish(&self.job.fence(), b"{}").await.expect("the running job can be finished");
        self.a.unregister_worker(&self.reg).await.expect("unregister");
        self.a.stop().await;
        self.stop_others().await;
    }
}

/// Waits `d` of local time (what the reapers must sit through).
async fn pause(d: Duration) {
    tokio::time::sleep(d).await;
}

fn open(dir: &Path) -> Arc<EmbeddedStore> {
    EmbeddedStore::open(EmbeddedOptions::new(dir)).expect("open the store")
}

/// Another process holds the write lock for `stall`, then rolls back;
/// then the reapers get two timeouts more, during which a wrong
/// observation would make one of them reap.
async fn survive_a_stall(entry_is_holder: bool, stall: Duration) {
    if entry_is_holder {
        return;
    }
    count_panics();
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    // A handle per node: each has its own writer, as an OS process does,
    // so the reapers compete with A's heartbeat for SQLite's lock.
    let stores: Vec<Arc<EmbeddedStore>> = (0..=OTHERS).map(|_| open(&dir)).collect();
    let c = Cluster::start(|i| stores[i].clone(), small_timeout()).await;
    pause(Duration::from_millis(1500)).await;
    c.assert_never_reaped("before the stall").await;

    let holder = LockHolder::spawn(LOCK_ENTRY, &dir, "immediate", "stall");
    let held = Instant::now();
    // A write of the test's own, to show that the store takes none.
    let jobs = c.a.jobs().clone();
    let write = tokio::spawn(async move {
        let r = jobs.add(T, b"during", b"{}", 0).await;
        (r, held.elapsed())
    });
    pause(stall).await;
    holder.release("rollback");
    let held = held.elapsed();
    let (added, waited) = write.await.expect("the write task");
    pause(Duration::from_secs(2 * TIMEOUT_S)).await;
    eprintln!(
        "stall of {held:?} (timeout {TIMEOUT_S} s, {} reapers): a write waited {waited:?} ({added:?}), \
         {} heartbeats failed, {} passes failed, {} reaps failed, {} observations restarted, {} reaped",
        OTHERS + 1,
        c.count("heartbeat_failed"),
        c.count("reaper_scan_failed"),
        c.count("reap_failed"),
        c.count("reaper_observation_restarted"),
        c.count("worker_reaped"),
    );
    c.assert_never_reaped("after the stall").await;
    assert!(waited >= stall.min(settings().tx_timeout).mul_f64(0.9), "the store took no write during the stall");
    c.finish().await;
    assert_eq!(panics(), 0, "no panic in any background task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_survives_another_process_holding_the_write_lock_for_2x_its_timeout() {
    survive_a_stall(lock::serve_if_holder(), Duration::from_secs(2 * TIMEOUT_S)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_survives_another_process_holding_the_write_lock_for_5x_its_timeout() {
    survive_a_stall(false, Duration::from_secs(5 * TIMEOUT_S)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_jump_of_100_s_reaps_no_worker() {
    count_panics();
    let tmp = tempfile::tempdir().expect("temp dir");
    // One handle for both nodes: the jump moves its clock, and every
    // transaction of both reapers and of the heartbeat reads it.
    let store = open(&tmp.path().join("store"));
    let c = Cluster::start(|_| store.clone(), small_timeout()).await;
    pause(Duration::from_millis(1500)).await;
    c.assert_never_reaped("before the jump").await;

    let before = store.clock_now();
    store.jump_versions(Duration::from_secs(100));
    let jumped = store.clock_now() - before;
    assert!(jumped >= 100_000_000, "the store's versions moved by {jumped}");
    pause(Duration::from_secs(2 * TIMEOUT_S)).await;
    let restarts = c.named("reaper_observation_restarted");
    let jumps = restarts.iter().filter(|e| field(e, "reason").as_deref() == Some("version_jump")).count();
    eprintln!(
        "versions jumped by {jumped} (100 s): {jumps} of {} reapers restarted their observation, {} reaped",
        OTHERS + 1,
        c.count("worker_reaped")
    );
    c.assert_never_reaped("after the jump").await;
    assert_eq!(jumps, OTHERS + 1, "each reaper saw the jump, once");
    c.finish().await;
    assert_eq!(panics(), 0, "no panic in any background task");
}

/// The same on the sim store, through a real recovery as FoundationDB
/// makes it: each node has its own handle on one simulated cluster with
/// FDB-like latencies; at the recovery the commits in flight are lost
/// (`commit_unknown_result`), every watch errors, transactions reading
/// before it fail too old, and versions jump by 100 s' worth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_on_the_sim_store_reaps_no_worker() {
    count_panics();
    let faults = SimFaults {
        commit_latency: Latency::between(Duration::from_micros(1_500), Duration::from_micros(2_500)),
        ..SimFaults::fdb_like_latencies()
    };
    let seed = rand::random();
    let cluster = SimStore::new(SimOptions::new(seed).faults(faults));
    let stores: Vec<Arc<SimStore>> = (0..=OTHERS).map(|_| cluster.connect()).collect();
    let c = Cluster::start(|i| stores[i].clone(), small_timeout()).await;
    pause(Duration::from_millis(1500)).await;
    c.assert_never_reaped("before the recovery").await;

    let before = cluster.version();
    cluster.recover();
    let jumped = cluster.version() - before;
    assert!(jumped >= RECOVERY_VERSION_JUMP, "seed {seed}: versions moved by {jumped}");
    pause(Duration::from_secs(2 * TIMEOUT_S)).await;
    let restarts = c.named("reaper_observation_restarted");
    let jumps = restarts.iter().filter(|e| field(e, "reason").as_deref() == Some("version_jump")).count();
    let failed = c.count("reaper_scan_failed");
    eprintln!(
        "sim recovery (seed {seed}): versions jumped by {jumped}; {jumps} reapers restarted their observation on the \
         jump, {failed} passes failed (too old), {} heartbeats failed, {} reaped; {:?}",
        c.count("heartbeat_failed"),
        c.count("worker_reaped"),
        cluster.stats()
    );
    c.assert_never_reaped(&format!("after the recovery (seed {seed})")).await;
    assert_eq!(cluster.stats().recoveries, 1);
    assert!(jumps + failed > OTHERS, "seed {seed}: every reaper restarted its observation ({jumps} + {failed})");
    c.finish().await;
    assert_eq!(panics(), 0, "no panic in any background task");
}

/// Node A dies; one of the other nodes' reapers removes its worker within
/// the timeout plus 1 s, and never a live one: node B holds a worker of
/// its own (same timeout), watched by every reaper all along. `stores[i]`
/// is node `i`'s handle (`shape.others + 1` of them).
async fn dead_node_reaped_in_time(stores: Vec<Db>, store: &str, shape: Shape) {
    count_panics();
    assert_eq!(stores.len(), shape.others + 1, "a handle per node");
    let timeout = Duration::from_secs(shape.timeout_s);
    let c = Cluster::start(|i| stores[i].clone(), shape).await;
    let live = c.b().register_worker(spec("live", shape.timeout_s)).await.expect("register B's worker");
    pause(Duration::from_millis(1500)).await;
    c.assert_never_reaped("while its node lives").await;

    // The worst case: A dies just after a renewal of its worker (begun,
    // then given 200 ms to commit), so that nearly the whole timeout runs
    // after the death, and then the reapers' first sight of that record.
    let renewals = c.a.heartbeat_transactions();
    let waiting = Instant::now();
    while c.a.heartbeat_transactions() == renewals {
        assert!(waiting.elapsed() < timeout, "{store}: A renewed nothing within its timeout");
        pause(Duration::from_millis(2)).await;
    }
    pause(Duration::from_millis(200)).await;

    // Node A dies without a goodbye (as at a kill -9): its tasks stop and
    // its store handle closes; its registration stays in the store.
    let died = Instant::now();
    c.a.stop().await;
    let db_b: Db = stores[1].clone();
    let ks = Keyspace::new(&db_b.prefix());
    let left = loop {
        let members = snapshot(db_b.as_ref(), &ks).await.members_of(T);
        assert!(members.contains(b"live".as_slice()), "{store}: B's live worker was reaped: {members:?}");
        if !members.contains(b"w".as_slice()) {
            break died.elapsed();
        }
        assert!(
            died.elapsed() < timeout + Duration::from_secs(3),
            "{store}: not reaped within {:?}; {}",
            died.elapsed(),
            restarts(&c)
        );
        pause(Duration::from_millis(5)).await;
    };
    eprintln!(
        "{store}: worker of the dead node left {} ms after the death (timeout {} s, surviving reapers: {}); {}",
        left.as_millis(),
        shape.timeout_s,
        shape.others,
        restarts(&c)
    );
    assert!(left <= timeout + Duration::from_secs(1), "{store}: reaped after {left:?}");
    // Its last heartbeat was at most about a third of the timeout before
    // the death: not reaped before the rest of the timeout passed.
    assert!(left >= timeout / 2, "reaped after only {left:?}");
    // The reaper logs after its commit returns, so the removal can be
    // seen here before the event is: wait for it (under load the reaper's
    // thread may run late), then for any second reap to show.
    let logged = Instant::now();
    while c.count("worker_reaped") == 0 && logged.elapsed() < Duration::from_secs(5) {
        pause(Duration::from_millis(5)).await;
    }
    pause(Duration::from_millis(200)).await;
    assert_eq!(c.count("worker_reaped"), 1, "reaped once, by one of the reapers");
    let job = c.b().jobs().get(T, b"j").await.expect("the job");
    assert_eq!(job.state, JobState::Pending, "its job went back to the queue");
    // B's worker, seen by every reaper since it registered, still is B's.
    let health = run(db_b.as_ref(), TxOptions::read(), |tx| {
        let ks = ks.clone();
        async move { workers::read_health(&tx, &ks, T, b"live").await }
    })
    .await
    .expect("read health");
    assert_eq!(health.and_then(|h| h.incarnation), Some(*live.incarnation()), "{store}: B's live worker");
    c.b().unregister_worker(&live).await.expect("unregister B's worker");
    c.stop_others().await;
    assert_eq!(panics(), 0, "no panic in any background task");
}

/// The reapers' observation restarts so far, by reason.
fn restarts(c: &Cluster) -> String {
    let mut by_reason = std::collections::BTreeMap::<String, usize>::new();
    for e in c.named("reaper_observation_restarted") {
        *by_reason.entry(field(&e, "reason").unwrap_or_default()).or_default() += 1;
    }
    format!("observation restarts {by_reason:?}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_s_worker_is_reaped_within_its_timeout_plus_1_s() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    dead_node_reaped_in_time((0..=OTHERS).map(|_| open(&dir) as Db).collect(), "embedded", small_timeout()).await;
}

/// The same on the sim store, whose read versions move only with commits
/// (as FoundationDB's do): once the dead node's heartbeats stop, only the
/// reapers' own commits move the versions that the liveness rule counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_s_worker_is_reaped_within_its_timeout_plus_1_s_on_the_sim_store() {
    let seed = rand::random();
    let cluster = SimStore::new(SimOptions::new(seed).faults(SimFaults::fdb_like_latencies()));
    let stores = (0..=OTHERS).map(|_| cluster.connect() as Db).collect();
    dead_node_reaped_in_time(stores, &format!("sim (seed {seed})"), small_timeout()).await;
}

/// A quiet cluster: nothing commits but the nodes themselves, at their own
/// cadence, with the default settings. On FoundationDB (and the sim
/// store, which hands out versions as its master does) read versions then
/// move in lumps: an idle commit proxy sends a batch only every
/// `MAX_COMMIT_BATCH_INTERVAL` (2 s), and each batch's version is the
/// previous one plus all the time since the previous batch (up to
/// `MAX_READ_TRANSACTION_LIFE_VERSIONS`, 5 s' worth). A dead node's worker
/// must still leave within its timeout plus 1 s, with the API's default
/// timeout (15 s) and a short one (4 s), with one surviving reaper and
/// with several.
fn quiet(timeout_s: u64, reapers: usize) -> Shape {
    Shape { timeout_s, others: reapers, settings: Settings::default() }
}

async fn quiet_sim(timeout_s: u64, reapers: usize) {
    let seed = rand::random();
    let cluster = SimStore::new(SimOptions::new(seed).faults(SimFaults::fdb_like_latencies()));
    let stores = (0..=reapers).map(|_| cluster.connect() as Db).collect();
    dead_node_reaped_in_time(stores, &format!("quiet sim (seed {seed})"), quiet(timeout_s, reapers)).await;
}

/// The same on a live FoundationDB cluster (`FDB_CLUSTER_FILE`), each node
/// a database handle of its own on one test directory. Run these one at
/// a time (`--test-threads 1`): another test's commits would make the
/// cluster busy, not quiet.
#[cfg(feature = "fdb")]
async fn quiet_fdb(timeout_s: u64, reapers: usize) {
    let dir = fdb::TestDir::new(fdb::require_cluster());
    let mut stores = Vec::new();
    for _ in 0..=reapers {
        stores.push(dir.open().await as Db);
    }
    dead_node_reaped_in_time(stores, "quiet FoundationDB", quiet(timeout_s, reapers)).await;
}

/// One test per shape, on the sim store and (ignored unless asked for, see
/// [`fdb`]) on FoundationDB.
macro_rules! quiet_cluster_tests {
    ($($name:ident: $timeout_s:expr, $reapers:expr;)*) => {
        mod quiet_cluster {
            $(
                mod $name {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn sim() {
                        super::super::quiet_sim($timeout_s, $reapers).await;
                    }

                    #[cfg(feature = "fdb")]
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    #[ignore = "needs a FoundationDB cluster: FDB_CLUSTER_FILE=... cargo test --features fdb --test faults_liveness -- --include-ignored --test-threads 1 quiet_cluster"]
                    async fn fdb() {
                        super::super::quiet_fdb($timeout_s, $reapers).await;
                    }
                }
            )*
        }
    };
}

quiet_cluster_tests! {
    timeout_4_s_1_reaper: 4, 1;
    timeout_4_s_3_reapers: 4, 3;
    timeout_15_s_1_reaper: 15, 1;
    timeout_15_s_3_reapers: 15, 3;
}

/// The live FoundationDB side: the cluster file, and a test directory
/// every node's handle opens (`couch_workers_test/<pid>-<random>`),
/// removed when the test ends. The tests are `#[ignore]`d, so that a plain
/// `cargo test` reports them as ignored, never as passed; run with
/// `--include-ignored` but without `FDB_CLUSTER_FILE`, each fails with a
/// loud line: none ever passes without a cluster.
#[cfg(feature = "fdb")]
mod fdb {
    use std::path::PathBuf;
    use std::sync::Arc;

    use couch_workers_core::store::fdb::{FdbStore, TEST_DIRECTORY};

    const MISSING: &str = "NOT RUN: the live FoundationDB liveness tests need FDB_CLUSTER_FILE (the cluster file \
                           of a test cluster, e.g. from scripts/fdb-cluster.sh run) and libfdb_c. See docs/fdb.md.";

    pub fn require_cluster() -> PathBuf {
        match std::env::var_os("FDB_CLUSTER_FILE").filter(|v| !v.is_empty()) {
            Some(path) => PathBuf::from(path),
            None => {
                let bar = "!".repeat(100);
                eprintln!("\n{bar}\n{MISSING}\n{bar}\n");
                panic!("{MISSING}");
            }
        }
    }

    /// A test directory; removed (with everything in it) on drop. Every
    /// handle opens it without removing it at close (`FdbStore::open_test`
    /// would remove it when the dead node's handle closes, under the
    /// living ones).
    pub struct TestDir {
        cluster_file: PathBuf,
        name: String,
    }

    impl TestDir {
        pub fn new(cluster_file: PathBuf) -> Self {
            TestDir { cluster_file, name: format!("{}-{:016x}", std::process::id(), rand::random::<u64>()) }
        }

        pub async fn open(&self) -> Arc<FdbStore> {
            FdbStore::open_at(&self.cluster_file, &[TEST_DIRECTORY, &self.name])
                .await
                .unwrap_or_else(|e| panic!("opening FDB test directory {}: {e}", self.name))
        }
    }

    impl Drop for TestDir {
        fn drop(&mut self) {
            // A fresh handle on a plain thread: drop runs inside the
            // test's runtime, and FDB's futures need none (its network
            // thread completes them).
            let (cluster_file, name) = (self.cluster_file.clone(), self.name.clone());
            let removed = std::thread::spawn(move || {
                futures::executor::block_on(async {
                    FdbStore::open_at(&cluster_file, &[TEST_DIRECTORY, &name]).await?.remove_directory().await
                })
            })
            .join();
            if !matches!(removed, Ok(Ok(_))) {
                eprintln!("WARNING: FDB test directory ({TEST_DIRECTORY}, {}) not removed: {removed:?}", self.name);
            }
        }
    }
}
