//! A fault-injecting [`Database`]: wraps a real store and makes its calls
//! fail at random, the way FoundationDB (or a sick disk) can, so that tests
//! can show what the key-space code and the services do about it.
//!
//! Faults are drawn from a seeded RNG at five points:
//!
//! | point | faults (retryable ones first) |
//! | --- | --- |
//! | `create_transaction` | `Busy`; `Io` |
//! | reads (`get`, `get_range`, `read_version`) | `Conflict`, `Busy`, `TooOld`; `Io` |
//! | writes (`set`, `clear`, ...) | the write is applied, then the transaction is poisoned: its next read or its commit fails with `Conflict` or `TooOld`, or `Io` (FoundationDB reports write errors late too) |
//! | `commit` | `Conflict`, `Busy`, `TooOld`, `CommitUnknown` *after* really committing, `CommitUnknown` *without* committing; `Io` |
//! | watches | the watch resolves early: spuriously (`Ok`, which the contract allows) or with an error |
//!
//! `CommitUnknown` is the interesting one: FoundationDB may report it for a
//! commit that happened, and the retry loop then runs the closure again on
//! top of its own write. That is why every transaction of this crate
//! re-reads what it changes; this wrapper is how the tests check it.
//!
//! The switch ([`FaultyStore::set_enabled`]) turns faults on and off while
//! the store is in use ("when the fault clears, everything recovers").
//! With several tasks drawing from the one RNG the sequence of faults
//! depends on scheduling: the seed makes a run repeatable in its rates and
//! kinds, not draw for draw.
//!
//! Not for production: nothing outside tests opens one.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{CommitInfo, Database, Db, KeyValue, RangeRequest, StoreError, Transaction, Tx, TxOptions, Watch};

/// How often each point fails (each a probability in `[0, 1]`), and how.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultPlan {
    pub seed: u64,
    pub create: f64,
    pub read: f64,
    pub write: f64,
    pub commit: f64,
    pub watch: f64,
    /// Of the faults injected, the share that are non-retryable
    /// ([`StoreError::Io`]); the rest are retryable.
    pub io_share: f64,
    /// Of the `CommitUnknown` faults, the share that really committed.
    pub unknown_committed_share: f64,
    /// Whether faults are on from the start.
    pub enabled: bool,
}

impl FaultPlan {
    /// Every point fails with probability `rate`, retryable faults only.
    pub fn retryable(seed: u64, rate: f64) -> Self {
        FaultPlan {
            seed,
            create: rate,
            read: rate,
            write: rate,
            commit: rate,
            watch: rate,
            io_share: 0.0,
            unknown_committed_share: 0.5,
            enabled: true,
        }
    }

    /// The same, with `io_share` of the faults non-retryable.
    pub fn with_io(mut self, io_share: f64) -> Self {
        self.io_share = io_share;
        self
    }
}

/// Where a fault was injected, and which; counts since the store was
/// wrapped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    pub at_create: u64,
    pub at_read: u64,
    pub at_write: u64,
    pub at_commit: u64,
    pub at_watch: u64,
    pub conflict: u64,
    pub busy: u64,
    pub too_old: u64,
    /// `CommitUnknown` reported for a commit that happened.
    pub unknown_committed: u64,
    /// `CommitUnknown` reported for a commit that did not happen.
    pub unknown_not_committed: u64,
    pub io: u64,
    /// Watches that fired early without an error.
    pub watch_spurious: u64,
}

impl FaultStats {
    /// Every fault injected.
    pub fn total(&self) -> u64 {
        self.at_create + self.at_read + self.at_write + self.at_commit + self.at_watch
    }
}

#[derive(Debug, Clone, Copy)]
enum Point {
    Create,
    Read,
    Write,
    Commit,
}

/// What a commit fault does.
enum CommitFault {
    /// Fail with this error without committing.
    Fail(StoreError),
    /// Commit for real, then report `CommitUnknown`.
    CommittedUnknown,
}

#[derive(Default)]
struct Counters {
    at_create: AtomicU64,
    at_read: AtomicU64,
    at_write: AtomicU64,
    at_commit: AtomicU64,
    at_watch: AtomicU64,
    conflict: AtomicU64,
    busy: AtomicU64,
    too_old: AtomicU64,
    unknown_committed: AtomicU64,
    unknown_not_committed: AtomicU64,
    io: AtomicU64,
    watch_spurious: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// What the store and its transactions share.
struct Injector {
    plan: FaultPlan,
    enabled: AtomicBool,
    rng: Mutex<StdRng>,
    counts: Counters,
}

impl Injector {
    fn rng(&self) -> MutexGuard<'_, StdRng> {
        self.rng.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn rate(&self, point: Point) -> f64 {
        match point {
            Point::Create => self.plan.create,
            Point::Read => self.plan.read,
            Point::Write => self.plan.write,
            Point::Commit => self.plan.commit,
        }
    }

    /// True with probability `p` (a `p` outside `[0, 1]` is clamped, NaN
    /// is 0).
    fn chance(&self, p: f64) -> bool {
        p > 0.0 && self.rng().random_bool(p.min(1.0))
    }

    /// Whether a fault happens now at a point of probability `rate`.
    fn hit(&self, rate: f64) -> bool {
        self.enabled.load(Ordering::Acquire) && self.chance(rate)
    }

    /// An error for `point`, or `None` (no fault now).
    fn draw(&self, point: Point) -> Option<StoreError> {
        if !self.hit(self.rate(point)) {
            return None;
        }
        let c = &self.counts;
        bump(match point {
            Point::Create => &c.at_create,
            Point::Read => &c.at_read,
            Point::Write => &c.at_write,
            Point::Commit => &c.at_commit,
        });
        if self.chance(self.plan.io_share) {
            bump(&c.io);
            let where_ = match point {
                Point::Create => "create_transaction",
                Point::Read => "read",
                Point::Write => "write",
                Point::Commit => "commit",
            };
            return Some(StoreError::Io(format!("injected fault at {where_}")));
        }
        let choices: &[StoreError] = match point {
            Point::Create => &[StoreError::Busy],
            Point::Read => &[StoreError::Conflict, StoreError::Busy, StoreError::TooOld],
            Point::Write => &[StoreError::Conflict, StoreError::TooOld],
            Point::Commit => &[StoreError::Conflict, StoreError::Busy, StoreError::TooOld, StoreError::CommitUnknown],
        };
        let err = choices[self.rng().random_range(0..choices.len())].clone();
        bump(match err {
            StoreError::Conflict => &c.conflict,
            StoreError::Busy => &c.busy,
            StoreError::TooOld => &c.too_old,
            // Counted as committed or not by `commit_fault`.
            _ => return Some(err),
        });
        Some(err)
    }

    fn commit_fault(&self) -> Option<CommitFault> {
        let err = self.draw(Point::Commit)?;
        if err != StoreError::CommitUnknown {
            return Some(CommitFault::Fail(err));
        }
        if self.chance(self.plan.unknown_committed_share) {
            bump(&self.counts.unknown_committed);
            Some(CommitFault::CommittedUnknown)
        } else {
            bump(&self.counts.unknown_not_committed);
            Some(CommitFault::Fail(StoreError::CommitUnknown))
        }
    }

    /// A watch fault: how long after arming it fires, and with what.
    fn watch_fault(&self) -> Option<(Duration, Result<(), StoreError>)> {
        if !self.hit(self.plan.watch) {
            return None;
        }
        bump(&self.counts.at_watch);
        let delay = Duration::from_millis(self.rng().random_range(0..20));
        if self.chance(0.5) {
            bump(&self.counts.watch_spurious);
            Some((delay, Ok(())))
        } else if self.chance(self.plan.io_share) {
            bump(&self.counts.io);
            Some((delay, Err(StoreError::Io("injected watch failure".into()))))
        } else {
            bump(&self.counts.busy);
            Some((delay, Err(StoreError::Busy)))
        }
    }
}

/// A store whose calls fail at random (see the module doc).
pub struct FaultyStore {
    inner: Db,
    injector: Arc<Injector>,
}

impl FaultyStore {
    /// Wraps `inner`; faults follow `plan`.
    pub fn wrap(inner: Db, plan: FaultPlan) -> Arc<FaultyStore> {
        let injector = Injector {
            enabled: AtomicBool::new(plan.enabled),
            rng: Mutex::new(StdRng::seed_from_u64(plan.seed)),
            plan,
            counts: Counters::default(),
        };
        Arc::new(FaultyStore { inner, injector: Arc::new(injector) })
    }

    /// Turns faults on or off, at once, for every transaction (also those
    /// already open).
    pub fn set_enabled(&self, enabled: bool) {
        self.injector.enabled.store(enabled, Ordering::Release);
    }

    pub fn is_enabled(&self) -> bool {
        self.injector.enabled.load(Ordering::Acquire)
    }

    /// The wrapped store (no faults).
    pub fn inner(&self) -> &Db {
        &self.inner
    }

    pub fn plan(&self) -> &FaultPlan {
        &self.injector.plan
    }

    /// Faults injected so far.
    pub fn stats(&self) -> FaultStats {
        let c = &self.injector.counts;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FaultStats {
            at_create: get(&c.at_create),
            at_read: get(&c.at_read),
            at_write: get(&c.at_write),
            at_commit: get(&c.at_commit),
            at_watch: get(&c.at_watch),
            conflict: get(&c.conflict),
            busy: get(&c.busy),
            too_old: get(&c.too_old),
            unknown_committed: get(&c.unknown_committed),
            unknown_not_committed: get(&c.unknown_not_committed),
            io: get(&c.io),
            watch_spurious: get(&c.watch_spurious),
        }
    }
}

impl std::fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyStore")
            .field("inner", &self.inner.kind())
            .field("plan", &self.injector.plan)
            .field("enabled", &self.is_enabled())
            .finish()
    }
}

#[async_trait]
impl Database for FaultyStore {
    async fn create_transaction(&self, opts: &TxOptions) -> Result<Tx, StoreError> {
        if let Some(err) = self.injector.draw(Point::Create) {
            return Err(err);
        }
        let inner = self.inner.create_transaction(opts).await?;
        Ok(Arc::new(FaultyTransaction { inner, injector: self.injector.clone(), poison: Mutex::new(None) }))
    }

    fn prefix(&self) -> Vec<u8> {
        self.inner.prefix()
    }

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn backoff_policy(&self) -> crate::store::backoff::BackoffPolicy {
        self.inner.backoff_policy()
    }

    /// The wrapped store's: its commits (the embedded store's group
    /// commit) are still decided after the budget ends.
    fn commit_grace(&self, budget: Duration) -> Duration {
        self.inner.commit_grace(budget)
    }

    fn durability(&self) -> String {
        format!("{} (with injected faults)", self.inner.durability())
    }

    fn close(&self) {
        self.inner.close();
    }
}

struct FaultyTransaction {
    inner: Tx,
    injector: Arc<Injector>,
    /// A write fault, reported by the next read or the commit.
    poison: Mutex<Option<StoreError>>,
}

impl FaultyTransaction {
    fn poison(&self) -> MutexGuard<'_, Option<StoreError>> {
        self.poison.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The fault a read meets: a poisoned write, or a new one.
    fn read_fault(&self) -> Result<(), StoreError> {
        if let Some(err) = self.poison().clone() {
            return Err(err);
        }
        match self.injector.draw(Point::Read) {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }

    fn after_write(&self) {
        if let Some(err) = self.injector.draw(Point::Write) {
            self.poison().get_or_insert(err);
        }
    }
}

#[async_trait]
impl Transaction for FaultyTransaction {
    async fn get(&self, key: &[u8], snapshot: bool) -> Result<Option<Vec<u8>>, StoreError> {
        self.read_fault()?;
        self.inner.get(key, snapshot).await
    }

    async fn get_range(&self, range: &RangeRequest) -> Result<Vec<KeyValue>, StoreError> {
        self.read_fault()?;
        self.inner.get_range(range).await
    }

    async fn read_version(&self) -> Result<u64, StoreError> {
        self.read_fault()?;
        self.inner.read_version().await
    }

    fn set(&self, key: &[u8], value: &[u8]) {
        self.inner.set(key, value);
        self.after_write();
    }

    fn clear(&self, key: &[u8]) {
        self.inner.clear(key);
        self.after_write();
    }

    fn clear_range(&self, begin: &[u8], end: &[u8]) {
        self.inner.clear_range(begin, end);
        self.after_write();
    }

    fn atomic_add(&self, key: &[u8], delta: i64) {
        self.inner.atomic_add(key, delta);
        self.after_write();
    }

    fn atomic_byte_max(&self, key: &[u8], value: &[u8]) {
        self.inner.atomic_byte_max(key, value);
        self.after_write();
    }

    fn set_versionstamped_key(&self, key: &[u8], value: &[u8]) {
        self.inner.set_versionstamped_key(key, value);
        self.after_write();
    }

    fn set_versionstamped_value(&self, key: &[u8], value: &[u8]) {
        self.inner.set_versionstamped_value(key, value);
        self.after_write();
    }

    fn add_read_conflict_key(&self, key: &[u8]) {
        self.inner.add_read_conflict_key(key);
    }

    fn watch(&self, key: &[u8]) -> Watch {
        let watch = self.inner.watch(key);
        match self.injector.watch_fault() {
            None => watch,
            Some((delay, outcome)) => Box::pin(async move {
                // The real watch is dropped (and so cancelled) at once.
                drop(watch);
                tokio::time::sleep(delay).await;
                outcome
            }),
        }
    }

    async fn commit(&self) -> Result<CommitInfo, StoreError> {
        if let Some(err) = self.poison().clone() {
            return Err(err);
        }
        match self.injector.commit_fault() {
            None => self.inner.commit().await,
            Some(CommitFault::Fail(err)) => Err(err),
            Some(CommitFault::CommittedUnknown) => {
                self.inner.commit().await?;
                Err(StoreError::CommitUnknown)
            }
        }
    }

    async fn on_error(&self, err: StoreError) -> Result<(), StoreError> {
        self.inner.on_error(err).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::embedded::{EmbeddedOptions, EmbeddedStore};
    use crate::store::run;

    fn store(plan: FaultPlan) -> (tempfile::TempDir, Arc<FaultyStore>) {
        let dir = tempfile::tempdir().expect("temp dir");
        let inner: Db = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open");
        (dir, FaultyStore::wrap(inner, plan))
    }

    #[tokio::test]
    async fn off_means_no_fault() {
        let mut plan = FaultPlan::retryable(1, 1.0).with_io(1.0);
        plan.enabled = false;
        let (_dir, db) = store(plan);
        for i in 0u32..50 {
            run(db.as_ref(), TxOptions::write(), |tx| async move {
                tx.set(b"k", &i.to_be_bytes());
                tx.get(b"k", false).await
            })
            .await
            .expect("no fault while off");
        }
        assert_eq!(db.stats(), FaultStats::default());
    }

    #[tokio::test]
    async fn io_faults_are_not_retried_and_clear_when_switched_off() {
        let (_dir, db) = store(FaultPlan::retryable(2, 1.0).with_io(1.0));
        let err = run(db.as_ref(), TxOptions::write(), |tx| async move { tx.get(b"k", false).await })
            .await
            .expect_err("every call fails");
        assert!(matches!(err, StoreError::Io(_)), "{err:?}");
        assert_eq!(db.stats().total(), 1, "an I/O error is not retried");
        db.set_enabled(false);
        run(db.as_ref(), TxOptions::write(), |tx| async move { tx.get(b"k", false).await }).await.expect("recovered");
    }

    #[tokio::test]
    async fn commit_unknown_after_commit_really_committed() {
        let mut plan = FaultPlan::retryable(3, 0.0);
        plan.commit = 1.0;
        plan.unknown_committed_share = 1.0;
        let (_dir, db) = store(plan);
        // Every commit fails: find one that was CommitUnknown-after-commit.
        let mut attempts = 0;
        loop {
            attempts += 1;
            assert!(attempts < 1000, "no CommitUnknown drawn");
            let tx = db.create_transaction(&TxOptions::write()).await.expect("tx");
            tx.atomic_add(b"n", 1);
            let err = tx.commit().await.expect_err("every commit fails");
            if err == StoreError::CommitUnknown {
                break;
            }
        }
        let n = run(db.inner().as_ref(), TxOptions::read(), |tx| async move { tx.get(b"n", false).await })
            .await
            .expect("read")
            .expect("the CommitUnknown commit happened");
        assert_eq!(i64::from_le_bytes(n[..8].try_into().unwrap()), 1, "only the unknown commit went through");
        assert_eq!(db.stats().unknown_committed, 1);
    }
}
