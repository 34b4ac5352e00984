//! The `sim` store: an in-memory FoundationDB for tests. It reproduces the
//! concurrency and failure semantics that the embedded store, whose
//! writers are serialized, cannot show, as FoundationDB's documentation
//! and source define them (`docs/sim.md` lists each with its source):
//!
//! * a read version per transaction, the last committed version: it moves
//!   only with commits, and an idle cluster commits an empty batch every
//!   2 s;
//! * optimistic concurrency: per-key and per-range read and write
//!   conflict ranges, checked at commit against every commit since the
//!   read version (`not_committed`, 1020); snapshot reads add none;
//! * commit batches: the transactions of one batch share a commit version
//!   and get distinct versionstamps (their order in the batch);
//! * `transaction_too_old` (1007) once the read version is more than 5 s
//!   of versions behind;
//! * watches that fire after a change and may fire spuriously; at most
//!   10,000 outstanding per handle (`too_many_watches`, 1032);
//! * `accessed_unreadable` (1036) on reading what a versionstamped
//!   operation of the same transaction wrote;
//! * FDB's size limits, counted as FDB counts them;
//! * seeded, reproducible faults ([`SimFaults`]): `commit_unknown_result`
//!   (1021) after a commit that happened and after one that did not,
//!   recoveries (queued commits lost, watches error, versions jump by
//!   100 s' worth, older transactions fail too old), latencies.
//!
//! It is a test store: reached only through [`SimStore::new`] from Rust,
//! never through the application's `store` setting; its
//! [`kind`](Database::kind) is `"sim"`, never `"fdb"`, and nothing run on
//! it counts as a FoundationDB run.
//!
//! | module | job |
//! | --- | --- |
//! | `mod.rs` | [`SimStore`] (a handle), [`SimOptions`], [`SimStats`], [`Database`] |
//! | `cluster.rs` | the shared cluster: reads, the commit proxy and its batches, recoveries |
//! | `transaction.rs` | [`SimTransaction`]: read versions, read-your-writes, conflict ranges, commit |
//! | `writes.rs` | a transaction's buffered writes, unreadable ranges, FDB's size accounting |
//! | `conflicts.rs` | conflict range sets and the resolver's history |
//! | `data.rs` | the multi-version key-value data |
//! | `versions.rs` | the version clock (commit versions, empty batches, recovery jumps) |
//! | `watch.rs` | armed watches and the per-handle watch limit |
//! | `faults.rs` | [`SimFaults`], [`Latency`], [`CommitFault`]: the seeded dice |

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;

use super::{Database, StoreError, Tx, TxOptions};

mod cluster;
mod conflicts;
mod data;
mod faults;
mod transaction;
mod versions;
mod watch;
mod writes;

use cluster::Cluster;
use watch::WatchCount;

pub use faults::{CommitFault, Latency, SimFaults};
pub use transaction::SimTransaction;
pub use versions::{EMPTY_BATCH_INTERVAL, RECOVERY_VERSION_JUMP};
pub use watch::MAX_WATCHES;

/// How a simulated cluster starts.
#[derive(Debug, Clone, PartialEq)]
pub struct SimOptions {
    /// Seeds every random choice (faults, latencies, backoff).
    pub seed: u64,
    pub faults: SimFaults,
    /// The key-space prefix every handle reports (FDB: the `couchdb`
    /// directory's prefix); not empty, so that code which forgets the
    /// prefix fails here as it would on FoundationDB.
    pub prefix: Vec<u8>,
    /// The cluster's first version.
    pub start_version: u64,
}

impl SimOptions {
    pub fn new(seed: u64) -> Self {
        SimOptions { seed, faults: SimFaults::none(), prefix: vec![0x15, 0x07], start_version: 1_000_000 }
    }

    pub fn faults(mut self, faults: SimFaults) -> Self {
        self.faults = faults;
        self
    }
}

/// Counters of one cluster (shared by its handles).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SimStats {
    /// Read versions handed out (one per transaction that read): how
    /// often a node reads, e.g. a watcher that polls.
    pub read_versions: u64,
    /// Transactions committed (including those answered `commit_unknown_result`).
    pub commits: u64,
    /// Commit batches (not counting the idle cluster's empty ones).
    pub batches: u64,
    /// Empty batches of the idle cluster.
    pub empty_batches: u64,
    /// Commits rejected with `not_committed` (1020).
    pub conflicts: u64,
    /// Reads and commits rejected with `transaction_too_old` (1007).
    pub too_old: u64,
    /// `commit_unknown_result` answers after a commit that happened.
    pub unknown_committed: u64,
    /// `commit_unknown_result` answers after a commit that did not happen.
    pub unknown_not_committed: u64,
    pub recoveries: u64,
    pub spurious_watch_fires: u64,
    /// Watches armed now, on every handle.
    pub armed_watches: usize,
}

/// What a handle's transactions share.
pub(crate) struct Handle {
    id: u64,
    cluster: Arc<Cluster>,
    watch_count: Arc<WatchCount>,
    closed: AtomicBool,
}

impl Handle {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// One database handle on a simulated cluster (as another node's
/// `fdb_create_database` would be): its own watches and watch limit, the
/// cluster's data. [`SimStore::connect`] opens another handle on the same
/// cluster.
pub struct SimStore {
    handle: Arc<Handle>,
    prefix: Vec<u8>,
    next_handle: Arc<AtomicU64>,
}

impl SimStore {
    /// A new, empty simulated cluster and a first handle on it.
    pub fn new(opts: SimOptions) -> Arc<SimStore> {
        let cluster = Cluster::new(opts.seed, opts.faults, opts.start_version);
        Self::handle_on(cluster, opts.prefix, Arc::new(AtomicU64::new(0)))
    }

    fn handle_on(cluster: Arc<Cluster>, prefix: Vec<u8>, next_handle: Arc<AtomicU64>) -> Arc<SimStore> {
        let id = next_handle.fetch_add(1, Ordering::Relaxed);
        let handle = Arc::new(Handle { id, cluster, watch_count: Arc::default(), closed: AtomicBool::new(false) });
        Arc::new(SimStore { handle, prefix, next_handle })
    }

    /// Another handle on the same cluster.
    pub fn connect(&self) -> Arc<SimStore> {
        Self::handle_on(self.handle.cluster.clone(), self.prefix.clone(), self.next_handle.clone())
    }

    /// A recovery, now: queued commits answer `commit_unknown_result` and
    /// are lost, armed watches error, versions jump by
    /// [`RECOVERY_VERSION_JUMP`].
    pub fn recover(&self) {
        self.handle.cluster.recover();
    }

    /// The fault the next commit gets (before the random ones); queued
    /// in order when called several times.
    pub fn inject_commit_fault(&self, fault: CommitFault) {
        self.handle.cluster.script(fault);
    }

    /// Changes the random faults and latencies from now on.
    pub fn set_faults(&self, faults: SimFaults) {
        self.handle.cluster.set_faults(faults);
    }

    pub fn stats(&self) -> SimStats {
        self.handle.cluster.stats()
    }

    /// The cluster's last committed version now.
    pub fn version(&self) -> u64 {
        self.handle.cluster.current_version()
    }

    /// Watches this handle has outstanding (counted towards [`MAX_WATCHES`]).
    pub fn outstanding_watches(&self) -> usize {
        self.handle.watch_count.get()
    }
}

impl std::fmt::Debug for SimStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimStore").field("handle", &self.handle.id).field("closed", &self.handle.is_closed()).finish()
    }
}

#[async_trait]
impl Database for SimStore {
    async fn create_transaction(&self, _opts: &TxOptions) -> Result<Tx, StoreError> {
        if self.handle.is_closed() {
            return Err(StoreError::Closed);
        }
        Ok(Arc::new(SimTransaction::new(self.handle.clone())))
    }

    fn prefix(&self) -> Vec<u8> {
        self.prefix.clone()
    }

    fn kind(&self) -> &'static str {
        "sim"
    }

    fn durability(&self) -> String {
        "in memory (sim store: a test store, not FoundationDB)".into()
    }

    fn close(&self) {
        if !self.handle.closed.swap(true, Ordering::AcqRel) {
            self.handle.cluster.fail_watches(self.handle.id, &StoreError::Closed);
        }
    }
}
