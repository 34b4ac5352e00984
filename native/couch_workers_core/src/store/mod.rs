//! The store abstraction: FoundationDB's transaction model, written once.
//!
//! Every line of key-space logic (workers, membership, jobs) talks to a
//! [`Database`] through [`run`], the one bounded retry loop, and to a
//! [`Transaction`] inside it. Two stores implement it:
//!
//! * [`embedded`]: SQLite in WAL mode on local disk, shared by every OS
//!   process on the host that opens the same directory (the default);
//! * `fdb` (cargo feature `fdb`): FoundationDB through the `foundationdb`
//!   crate;
//! * [`sim`]: an in-memory FoundationDB for tests (optimistic conflicts,
//!   read versions that move only with commits, recoveries, injected
//!   faults; feature `testkit`); never selectable from the configuration.
//!
//! Semantics every store must honour (checked by the conformance suite,
//! `conformance.rs`, feature `testkit`):
//!
//! * serializable transactions; reads see the transaction's own writes;
//! * ordered byte keys, range reads with a limit and in reverse;
//! * `atomic_add`: FoundationDB's ADD on a little-endian 64-bit integer;
//! * versionstamped keys and values in FoundationDB's API-520 format: the
//!   parameter ends with a 4-byte little-endian offset of a 10-byte
//!   placeholder, replaced at commit by the commit's versionstamp (8-byte
//!   big-endian commit version, 2-byte big-endian order within the commit);
//! * commit versions rise with time at about one million per second; a
//!   commit's version is greater than that of every commit it can see, and
//!   versionstamps (version + order within the commit batch) are unique
//!   across every process sharing the store (on FoundationDB, transactions
//!   of one batch share a version, never a versionstamp);
//! * watches that fire after a key's value differs from the value the
//!   creating transaction saw, also for commits of other processes;
//! * FoundationDB's limits: keys up to [`MAX_KEY_SIZE`], values up to
//!   [`MAX_VALUE_SIZE`], transactions up to [`MAX_TRANSACTION_SIZE`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;

pub mod embedded;
#[cfg(feature = "fdb")]
pub mod fdb;
// A test store, shipped in nothing: behind the test kit like the suites
// that run on it.
pub mod config;
#[cfg(feature = "testkit")]
pub mod sim;
// Test wrappers, behind the test kit too: random faults (`faulty`), and
// a forwarding transaction with a test's hooks (`hooked`).
#[cfg(feature = "testkit")]
pub mod faulty;
#[cfg(feature = "testkit")]
pub mod hooked;
// FoundationDB's mutation formats (versionstamp parameters, ADD), shared
// by the stores that implement them themselves (embedded, sim).
pub mod backoff;
pub mod cluster_file;
// The decisions on FoundationDB's error codes: the `fdb` store's, tested
// without libfdb_c.
#[cfg(any(feature = "fdb", test, feature = "internals"))]
pub mod fdb_client;
// A transaction someone else owns and commits (the caller's erlfdb
// transaction): every call goes out through a channel.
pub mod forward;
pub(crate) mod mutation;
// What the calls in one caller's transaction wrote with versionstamps,
// read back by the later calls in it.
pub mod overlay;
pub mod receipt;
mod retry;

pub use config::{open, StoreConfig};
pub use retry::{run, run_attempts, Attempt};

/// FoundationDB's key size limit, in bytes.
pub const MAX_KEY_SIZE: usize = 10_000;
/// FoundationDB's value size limit, in bytes.
pub const MAX_VALUE_SIZE: usize = 100_000;
/// FoundationDB's transaction size limit (keys + values written), in bytes.
pub const MAX_TRANSACTION_SIZE: usize = 10_000_000;
/// Length of a versionstamp: 8-byte commit version + 2-byte batch order.
pub const VERSIONSTAMP_LEN: usize = 10;

/// Commit versions per second (FoundationDB's `VERSIONS_PER_SECOND`): the
/// rate at which every store's versions rise with time.
pub const VERSIONS_PER_SECOND: u64 = 1_000_000;

/// FoundationDB's `MAX_READ_TRANSACTION_LIFE_VERSIONS` (5 s' worth, and its
/// write twin): a transaction whose read version is further behind than
/// this fails with `transaction_too_old`; also the most that versions move
/// from one commit batch to the next outside a recovery (the master's
/// `getVersion`).
pub const MAX_READ_TRANSACTION_LIFE_VERSIONS: u64 = 5 * VERSIONS_PER_SECOND;

/// FoundationDB's `MAX_VERSIONS_IN_FLIGHT` (100 s' worth): how far versions
/// jump at every recovery (the sim store's recoveries, the tests).
#[cfg(any(test, feature = "internals"))]
pub const MAX_VERSIONS_IN_FLIGHT: u64 = 100 * VERSIONS_PER_SECOND;

/// A 10-byte FoundationDB versionstamp. Byte order is commit order.
pub type Versionstamp = [u8; VERSIONSTAMP_LEN];

/// A key-value pair read from a store.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// A shared transaction handle, cloned into the retry loop's closure.
pub type Tx = Arc<dyn Transaction>;

/// A watch: resolves `Ok(())` once the watched key's value has changed
/// (or may have: like FoundationDB's, a watch may fire spuriously, and
/// callers re-read). Dropping it cancels it.
pub type Watch = BoxFuture<'static, Result<(), StoreError>>;

/// Why a store call failed.
///
/// Three kinds are kept apart: retryable ones (conflict, busy, a too-old
/// read) that [`run`] retries and never leak unless the retry budget is
/// spent; limit violations that the key-space code maps to
/// `{error, key_too_large | value_too_large}`; and everything else.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// Another transaction committed a write this one read (FDB 1020).
    #[error("transaction conflict")]
    Conflict,
    /// The store is temporarily unavailable (a lock held by another
    /// process, FDB's "process behind"); retryable.
    #[error("store busy")]
    Busy,
    /// The transaction ran past the store's age limit (FDB 1007); retryable.
    #[error("transaction too old")]
    TooOld,
    /// The commit may or may not have happened (FDB 1021). Retryable only
    /// for idempotent transactions: [`run`] retries it, which is why every
    /// transaction in this crate re-reads what it is about to change.
    #[error("commit result unknown")]
    CommitUnknown,
    /// A key over [`MAX_KEY_SIZE`] (FDB 2102).
    #[error("key too large")]
    KeyTooLarge,
    /// A value over [`MAX_VALUE_SIZE`] (FDB 2103).
    #[error("value too large")]
    ValueTooLarge,
    /// Writes over [`MAX_TRANSACTION_SIZE`] (FDB 2101).
    #[error("transaction too large")]
    TransactionTooLarge,
    /// The retry loop's time budget ran out (FDB 1031).
    #[error("transaction timed out")]
    TimedOut,
    /// The retry loop's attempt budget ran out; holds the last error.
    #[error("retry limit reached after {attempts} attempts: {last}")]
    RetryLimit { attempts: u32, last: Box<StoreError> },
    /// The store was closed (application stopped).
    #[error("store closed")]
    Closed,
    /// A malformed call (bad versionstamp offset, key outside the store).
    #[error("invalid store operation: {0}")]
    Invalid(String),
    /// A disk or engine failure (read-only directory, disk full, ...).
    #[error("store I/O error: {0}")]
    Io(String),
    /// The store asked for is not built into this library (FoundationDB
    /// without the `fdb` feature); says how to get it.
    #[error("{0}")]
    NotBuilt(String),
    /// A FoundationDB error that has no better name here.
    #[error("fdb error {code}: {message}")]
    Fdb { code: i32, message: String, retryable: bool },
}

/// FoundationDB's error code for `accessed_unreadable`.
const ACCESSED_UNREADABLE: i32 = 1036;

impl StoreError {
    /// FoundationDB's `accessed_unreadable` (1036): a read of what the
    /// transaction itself wrote with a versionstamp. Every store answers it
    /// for the same reads, and then fails the transaction's commit with it.
    pub fn accessed_unreadable() -> StoreError {
        StoreError::Fdb {
            code: ACCESSED_UNREADABLE,
            message: "accessed_unreadable: read of a key or range written with a versionstamp in this transaction"
                .into(),
            retryable: false,
        }
    }

    /// Whether this is [`StoreError::accessed_unreadable`].
    pub fn is_accessed_unreadable(&self) -> bool {
        matches!(self, StoreError::Fdb { code: ACCESSED_UNREADABLE, .. })
    }

    /// Whether [`run`] may retry the transaction after this error.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Conflict | StoreError::Busy | StoreError::TooOld | StoreError::CommitUnknown => true,
            StoreError::Fdb { retryable, .. } => *retryable,
            _ => false,
        }
    }

    /// A short atom-like name, used in `{error, Name}` answers and logs.
    pub fn name(&self) -> &'static str {
        match self {
            StoreError::Conflict => "conflict",
            StoreError::Busy => "busy",
            StoreError::TooOld => "transaction_too_old",
            StoreError::CommitUnknown => "commit_unknown_result",
            StoreError::KeyTooLarge => "key_too_large",
            StoreError::ValueTooLarge => "value_too_large",
            StoreError::TransactionTooLarge => "transaction_too_large",
            StoreError::TimedOut => "timeout",
            StoreError::RetryLimit { .. } => "retry_limit",
            StoreError::Closed => "store_closed",
            StoreError::Invalid(_) => "invalid",
            StoreError::Io(_) => "store_io",
            StoreError::NotBuilt(_) => "fdb_not_built",
            StoreError::Fdb { .. } => "fdb_error",
        }
    }
}

/// A range read: keys `begin <= k < end`, at most `limit` of them
/// (0 = no limit), from the end when `reverse`. A `snapshot` read adds no
/// read conflict (FoundationDB's snapshot reads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeRequest {
    pub begin: Vec<u8>,
    pub end: Vec<u8>,
    pub limit: usize,
    pub reverse: bool,
    pub snapshot: bool,
}

impl RangeRequest {
    /// Every key in `[begin, end)`, forward, no limit.
    pub fn new(begin: impl Into<Vec<u8>>, end: impl Into<Vec<u8>>) -> Self {
        RangeRequest { begin: begin.into(), end: end.into(), limit: 0, reverse: false, snapshot: false }
    }

    /// Every key that starts with `prefix` (FDB's `range_starts_with`).
    pub fn prefix(prefix: &[u8]) -> Self {
        let (b, e) = prefix_range(prefix);
        RangeRequest::new(b, e)
    }

    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    pub fn reverse(mut self, reverse: bool) -> Self {
        self.reverse = reverse;
        self
    }

    pub fn snapshot(mut self, snapshot: bool) -> Self {
        self.snapshot = snapshot;
        self
    }
}

/// `[prefix, strinc(prefix))`: every key that starts with the raw bytes
/// `prefix`. Not for tuple-packed prefixes that end in a user element: a
/// packed byte string `w` is a byte prefix of the packed `w\x00...`, so
/// the key space uses the tuple layer's own range (`keyspace::tuple_range`).
pub fn prefix_range(prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut end = prefix.to_vec();
    while let Some(&last) = end.last() {
        if last == 0xff {
            end.pop();
        } else {
            *end.last_mut().unwrap() += 1;
            return (prefix.to_vec(), end);
        }
    }
    // All 0xff (or empty): everything after the prefix.
    (prefix.to_vec(), vec![0xff])
}

/// What a successful commit tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommitInfo {
    /// The commit version; `None` for a read-only transaction.
    pub version: Option<u64>,
    /// The versionstamp that replaced the placeholders, when the
    /// transaction used a versionstamped operation.
    pub versionstamp: Option<Versionstamp>,
}

/// Options of one [`run`]: the retry budget, and a hint for stores whose
/// writers are serialized (the embedded store takes its write lock up
/// front when `writes` is set, so that concurrent writers queue instead of
/// conflicting; FoundationDB ignores it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxOptions {
    /// The transaction will write.
    pub writes: bool,
    /// Total time budget over every attempt (FDB's transaction timeout).
    pub timeout: Duration,
    /// Most attempts before [`StoreError::RetryLimit`].
    pub retry_limit: u32,
}

impl TxOptions {
    /// A transaction that only reads.
    pub fn read() -> Self {
        TxOptions { writes: false, ..Self::default() }
    }

    /// A transaction that writes.
    pub fn write() -> Self {
        TxOptions { writes: true, ..Self::default() }
    }
}

impl Default for TxOptions {
    fn default() -> Self {
        TxOptions { writes: true, timeout: Duration::from_secs(5), retry_limit: 100 }
    }
}

/// One transaction. Reads are async; writes are buffered or applied at
/// once, as the store prefers, and their errors (limits, I/O) surface from
/// the next read or from [`Transaction::commit`], as in FoundationDB.
#[async_trait]
pub trait Transaction: Send + Sync {
    /// The value of `key`, seeing this transaction's own writes.
    async fn get(&self, key: &[u8], snapshot: bool) -> Result<Option<Vec<u8>>, StoreError>;

    /// The key-value pairs of a range, seeing this transaction's writes.
    async fn get_range(&self, range: &RangeRequest) -> Result<Vec<KeyValue>, StoreError>;

    /// The version this transaction reads at: on FoundationDB (and the
    /// `sim` store) the last committed version, which moves only with
    /// commits (an idle cluster commits an empty batch every 2 s); on the
    /// embedded store its clock. Liveness is measured on it, never on a
    /// wall clock, and so each reaper pass commits a write of its own.
    async fn read_version(&self) -> Result<u64, StoreError>;

    fn set(&self, key: &[u8], value: &[u8]);

    fn clear(&self, key: &[u8]);

    /// Clears every key in `[begin, end)`.
    fn clear_range(&self, begin: &[u8], end: &[u8]);

    /// FoundationDB's ADD: the stored value (missing = 0) as a little-endian
    /// signed 64-bit integer plus `delta`, wrapping.
    fn atomic_add(&self, key: &[u8], delta: i64);

    /// FoundationDB's BYTE_MAX: stores `value` when the key is missing,
    /// else the lexicographically larger of the stored value and `value`
    /// (a big-endian counter that never moves backwards).
    fn atomic_byte_max(&self, key: &[u8], value: &[u8]);

    /// `key` holds a 10-byte placeholder and ends with its 4-byte
    /// little-endian offset (what `foundationdb_tuple::pack_with_versionstamp`
    /// returns); the committed key has the commit's versionstamp there.
    fn set_versionstamped_key(&self, key: &[u8], value: &[u8]);

    /// Same for a value.
    fn set_versionstamped_value(&self, key: &[u8], value: &[u8]);

    /// Adds a read conflict on `key` without reading it.
    fn add_read_conflict_key(&self, key: &[u8]);

    /// A watch on `key`, armed when this transaction commits.
    fn watch(&self, key: &[u8]) -> Watch;

    /// Asks that this transaction's writes of `key` fire none of the
    /// watches of `key` armed through this same store handle that no other
    /// commit fired meanwhile: such a watch takes the value this
    /// transaction commits as the one it waits to see change, and goes on
    /// waiting. A change of `key` by any other commit (another handle,
    /// another process, or another transaction of this handle) still fires
    /// it, before or after this one. Call it before writing `key`. For a
    /// writer whose own commits the watch's owner learns of in-process
    /// (the node's heartbeat, whose renewals its reaper hears of from the
    /// heartbeat service): the watch's fire would only cost a wake-up of
    /// the watcher and of the runtime. A store that cannot tell the commits
    /// apart (FoundationDB, whose watches fire on every change) ignores
    /// it, and says so in [`Database::spares_own_watches`].
    fn spare_own_watches(&self, _key: &[u8]) {}

    /// Commits. Called once, by [`run`].
    async fn commit(&self) -> Result<CommitInfo, StoreError>;

    /// Prepares a retry after `err` (FDB's `on_error`: back off and reset).
    /// Returns `err` back when it is not retryable.
    async fn on_error(&self, err: StoreError) -> Result<(), StoreError>;
}

/// A store: hands out transactions.
#[async_trait]
pub trait Database: Send + Sync + 'static {
    /// A new transaction. `opts.writes` is a hint (see [`TxOptions`]).
    async fn create_transaction(&self, opts: &TxOptions) -> Result<Tx, StoreError>;

    /// The prefix the key space lives under: the directory `couchdb`'s
    /// prefix on FoundationDB, empty on the embedded store.
    fn prefix(&self) -> Vec<u8>;

    /// `"embedded"` or `"fdb"`: for logs and the benchmarks.
    fn kind(&self) -> &'static str;

    /// Human-readable durability setting, printed by the benchmarks.
    fn durability(&self) -> String;

    /// Whether read versions rise with time while nothing commits (the
    /// embedded store's clock-based versions). FoundationDB's (and the
    /// `sim` store's) move only with commits, so a service that measures
    /// time in versions must commit for them to move (the reaper's pulse).
    fn versions_follow_time(&self) -> bool {
        false
    }

    /// Whether a commit may answer `CommitUnknown` (FoundationDB's 1021,
    /// and the test stores that model it). The embedded store knows the
    /// outcome of every commit it answers, so the job queue writes no
    /// receipts on it (`store::receipt`).
    fn commits_may_be_unknown(&self) -> bool {
        true
    }

    /// Whether [`Transaction::spare_own_watches`] works here: a spared
    /// write fires no watch of this handle (the embedded store). Where it
    /// does not, the watches fire on every change as usual.
    fn spares_own_watches(&self) -> bool {
        false
    }

    /// How long the retry loop keeps waiting for a commit still under way
    /// when the call's time budget (`budget`, [`TxOptions::timeout`]) ends,
    /// so that it can answer the commit's outcome instead of
    /// `CommitUnknown`. Zero (the default): the commit is dropped at the
    /// budget's end, as on FoundationDB, whose outcome may be unknown
    /// anyway. The embedded store, whose commit may be waiting for a group
    /// commit that will decide it, declares a bound (`embedded::group`).
    fn commit_grace(&self, _budget: Duration) -> Duration {
        Duration::ZERO
    }

    /// How the retry loop spaces its attempts on this store:
    /// FoundationDB's schedule unless the store says otherwise.
    fn backoff_policy(&self) -> backoff::BackoffPolicy {
        backoff::BackoffPolicy::FDB
    }

    /// Stops the store's background threads and fails pending watches with
    /// [`StoreError::Closed`]. Idempotent.
    fn close(&self);
}

/// A shared database handle.
pub type Db = Arc<dyn Database>;
