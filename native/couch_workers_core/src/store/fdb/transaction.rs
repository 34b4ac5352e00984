//! [`FdbTransaction`]: the store's [`Transaction`] on one FoundationDB
//! transaction.
//!
//! FoundationDB's `commit` and `on_error` consume the transaction while
//! the trait takes `&self`, so the transaction sits in a small state
//! machine behind a `Mutex` (foundationdb-rs `RetryableTransaction` keeps
//! it in an `Arc` and unwraps it for the same reason). The lock is only
//! held to start an FDB operation, never across an `.await`: every FDB
//! future owns what it needs (`use<>` futures).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use foundationdb::options::{ConflictRangeType, MutationType, StreamingMode, TransactionOption};
use foundationdb::{FdbError, FdbResult, KeySelector, RangeOption, TransactionCommitError};
use tokio_util::sync::CancellationToken;

use super::{fdb_code, map_fdb_error};
use crate::store::{CommitInfo, KeyValue, RangeRequest, StoreError, Transaction, TxOptions, Versionstamp, Watch};

enum State {
    /// Usable: reads and writes go to it.
    Open(foundationdb::Transaction),
    /// `commit` failed; kept for `on_error`, which backs off and resets it.
    CommitFailed(TransactionCommitError),
    /// Taken by an operation in flight (commit, on_error), or done.
    Gone(&'static str),
}

/// One FoundationDB transaction behind the store's [`Transaction`] trait.
pub struct FdbTransaction {
    state: Mutex<State>,
    /// A versionstamped key or value was set: `commit` asks for the
    /// versionstamp (`get_versionstamp` must be called before commit).
    versionstamped: AtomicBool,
    /// An error of a write (which cannot return one), reported by the next
    /// read or by `commit`, as FoundationDB reports its own write errors.
    deferred: Mutex<Option<StoreError>>,
    /// Cancelled when the store closes or the network stops.
    closed: CancellationToken,
}

/// What a failed commit answers: `CommitUnknown` where the commit may
/// have landed (`fdb_client::commit_may_have_landed`: FoundationDB's
/// "maybe committed" errors and a commit the `timeout` option cut off),
/// so that no caller takes a write that may have landed for one that did
/// not; every other error of a commit means it did not happen.
pub fn commit_error(e: FdbError) -> StoreError {
    if crate::store::fdb_client::commit_may_have_landed(e.code()) {
        StoreError::CommitUnknown
    } else {
        map_fdb_error(e)
    }
}

/// Milliseconds for FDB's `timeout` option: at least 1 (0 disables it).
fn timeout_ms(opts: &TxOptions) -> i32 {
    i32::try_from(opts.timeout.as_millis()).unwrap_or(i32::MAX).max(1)
}

/// FDB's `retry_limit` counts retries (calls of `on_error`); the store's
/// `retry_limit` counts attempts. Same budget: retries = attempts - 1.
fn retry_limit(opts: &TxOptions) -> i32 {
    i32::try_from(opts.retry_limit.saturating_sub(1)).unwrap_or(i32::MAX)
}

/// Waits for an FDB future unless the store closes first.
async fn wait<T>(closed: &CancellationToken, fut: impl Future<Output = FdbResult<T>>) -> Result<T, StoreError> {
    tokio::select! {
        biased;
        _ = closed.cancelled() => Err(StoreError::Closed),
        result = fut => result.map_err(map_fdb_error),
    }
}

impl FdbTransaction {
    pub(super) fn new(
        tx: foundationdb::Transaction,
        opts: &TxOptions,
        closed: CancellationToken,
    ) -> Result<Self, StoreError> {
        // The retry loop (store::run) owns the budget; FDB's own limits are
        // set to the same values so that FDB never retries or waits longer
        // than the loop would. Both options survive on_error's reset.
        tx.set_option(TransactionOption::Timeout(timeout_ms(opts))).map_err(map_fdb_error)?;
        tx.set_option(TransactionOption::RetryLimit(retry_limit(opts))).map_err(map_fdb_error)?;
        Ok(FdbTransaction {
            state: Mutex::new(State::Open(tx)),
            versionstamped: AtomicBool::new(false),
            deferred: Mutex::new(None),
            closed,
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn take_deferred(&self) -> Option<StoreError> {
        self.deferred.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take()
    }

    fn defer(&self, err: StoreError) {
        let mut deferred = self.deferred.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // The first error is the one to report.
        deferred.get_or_insert(err);
    }

    /// Runs `f` on the open transaction to start a read. Reports a deferred
    /// write error first, as FDB reports its own on the next read.
    fn with_tx<T>(&self, f: impl FnOnce(&foundationdb::Transaction) -> T) -> Result<T, StoreError> {
        if let Some(err) = self.take_deferred() {
            return Err(err);
        }
        self.open_tx(f)
    }

    /// Runs `f` on the open transaction; leaves a deferred error for the
    /// next read or the commit.
    fn open_tx<T>(&self, f: impl FnOnce(&foundationdb::Transaction) -> T) -> Result<T, StoreError> {
        if self.closed.is_cancelled() {
            return Err(StoreError::Closed);
        }
        match &*self.state() {
            State::Open(tx) => Ok(f(tx)),
            State::CommitFailed(_) => Err(StoreError::Invalid("transaction used after a failed commit".into())),
            State::Gone(why) => Err(StoreError::Invalid(format!("transaction used after {why}"))),
        }
    }

    /// Runs a write on the open transaction; a misuse (a write after
    /// commit) becomes the next read's or the commit's error.
    fn write(&self, f: impl FnOnce(&foundationdb::Transaction)) {
        if let Err(err) = self.open_tx(f) {
            self.defer(err);
        }
    }
}

#[async_trait]
impl Transaction for FdbTransaction {
    async fn get(&self, key: &[u8], snapshot: bool) -> Result<Option<Vec<u8>>, StoreError> {
        let fut = self.with_tx(|tx| tx.get(key, snapshot))?;
        Ok(wait(&self.closed, fut).await?.map(|slice| slice.to_vec()))
    }

    async fn get_range(&self, range: &RangeRequest) -> Result<Vec<KeyValue>, StoreError> {
        let mut opt = RangeOption {
            begin: KeySelector::first_greater_or_equal(range.begin.clone()),
            end: KeySelector::first_greater_or_equal(range.end.clone()),
            limit: (range.limit > 0).then_some(range.limit),
            reverse: range.reverse,
            // Everything up to the limit is wanted at once.
            mode: StreamingMode::WantAll,
            ..RangeOption::default()
        };
        let mut out = Vec::new();
        // FDB returns a range in batches: ask again from after the last key
        // (RangeOption::next_range) until the limit or the end is reached.
        for iteration in 1.. {
            let fut = self.with_tx(|tx| tx.get_range(&opt, iteration, range.snapshot))?;
            let batch = wait(&self.closed, fut).await?;
            out.extend(batch.iter().map(|kv| (kv.key().to_vec(), kv.value().to_vec())));
            match opt.next_range(&batch) {
                Some(next) => opt = next,
                None => break,
            }
        }
        Ok(out)
    }

    async fn read_version(&self) -> Result<u64, StoreError> {
        let fut = self.with_tx(|tx| tx.get_read_version())?;
        let version = wait(&self.closed, fut).await?;
        u64::try_from(version).map_err(|_| StoreError::Invalid(format!("negative read version {version}")))
    }

    fn set(&self, key: &[u8], value: &[u8]) {
        self.write(|tx| tx.set(key, value));
    }

    fn clear(&self, key: &[u8]) {
        self.write(|tx| tx.clear(key));
    }

    fn clear_range(&self, begin: &[u8], end: &[u8]) {
        self.write(|tx| tx.clear_range(begin, end));
    }

    fn atomic_add(&self, key: &[u8], delta: i64) {
        self.write(|tx| tx.atomic_op(key, &delta.to_le_bytes(), MutationType::Add));
    }

    fn atomic_byte_max(&self, key: &[u8], value: &[u8]) {
        self.write(|tx| tx.atomic_op(key, value, MutationType::ByteMax));
    }

    fn set_versionstamped_key(&self, key: &[u8], value: &[u8]) {
        // `key` is already in API-520 form (placeholder + 4-byte LE offset).
        self.versionstamped.store(true, Ordering::Relaxed);
        self.write(|tx| tx.atomic_op(key, value, MutationType::SetVersionstampedKey));
    }

    fn set_versionstamped_value(&self, key: &[u8], value: &[u8]) {
        self.versionstamped.store(true, Ordering::Relaxed);
        self.write(|tx| tx.atomic_op(key, value, MutationType::SetVersionstampedValue));
    }

    fn add_read_conflict_key(&self, key: &[u8]) {
        let mut end = Vec::with_capacity(key.len() + 1);
        end.extend_from_slice(key);
        end.push(0x00);
        let mut failed = None;
        self.write(|tx| failed = tx.add_conflict_range(key, &end, ConflictRangeType::Read).err());
        if let Some(e) = failed {
            self.defer(map_fdb_error(e));
        }
    }

    fn watch(&self, key: &[u8]) -> Watch {
        let closed = self.closed.clone();
        match self.open_tx(|tx| tx.watch(key)) {
            // The FDB watch future is 'static: it outlives the transaction
            // and is armed by its commit (an uncommitted or failed
            // transaction fails it). Dropping it cancels the watch.
            Ok(fut) => Box::pin(async move { wait(&closed, fut).await }),
            Err(err) => Box::pin(async move { Err(err) }),
        }
    }

    async fn commit(&self) -> Result<CommitInfo, StoreError> {
        if let Some(err) = self.take_deferred() {
            return Err(err);
        }
        if self.closed.is_cancelled() {
            return Err(StoreError::Closed);
        }
        let tx = {
            let mut state = self.state();
            match std::mem::replace(&mut *state, State::Gone("commit")) {
                State::Open(tx) => tx,
                other => {
                    let why = match &other {
                        State::CommitFailed(_) => "a failed commit",
                        State::Gone(why) => why,
                        State::Open(_) => "an open transaction",
                    };
                    let err = StoreError::Invalid(format!("commit after {why}"));
                    *state = other;
                    return Err(err);
                }
            }
        };
        // Must be asked for before the commit; resolves after it.
        let versionstamp = self.versionstamped.load(Ordering::Relaxed).then(|| tx.get_versionstamp());
        let committed = match wait(&self.closed, async { Ok::<_, FdbError>(tx.commit().await) }).await? {
            Ok(committed) => committed,
            Err(failed) => {
                let err = commit_error(*failed);
                *self.state() = State::CommitFailed(failed);
                return Err(err);
            }
        };
        // -1: a read-only transaction (nothing was committed).
        let version = committed.committed_version().map_err(map_fdb_error)?;
        let version = u64::try_from(version).ok();
        let versionstamp = match versionstamp {
            None => None,
            // The commit happened but its versionstamp is unknown: the
            // caller cannot finish its work, and must re-read (as after
            // commit_unknown_result) rather than give up.
            Some(fut) => match wait(&self.closed, fut).await {
                Ok(bytes) => Some(Versionstamp::try_from(&bytes[..]).map_err(|_| StoreError::CommitUnknown)?),
                Err(StoreError::Closed) => return Err(StoreError::Closed),
                Err(_) => return Err(StoreError::CommitUnknown),
            },
        };
        Ok(CommitInfo { version, versionstamp })
    }

    async fn on_error(&self, err: StoreError) -> Result<(), StoreError> {
        if self.closed.is_cancelled() {
            return Err(StoreError::Closed);
        }
        let taken = std::mem::replace(&mut *self.state(), State::Gone("on_error"));
        let reset = match taken {
            // The commit failed: FDB knows the error; back off and reset.
            State::CommitFailed(failed) => wait(&self.closed, failed.on_error()).await,
            State::Open(tx) => match fdb_code(&err) {
                // A read failed with an FDB error: same backoff and reset.
                Some(code) => wait(&self.closed, tx.on_error(FdbError::from_code(code))).await,
                // Not an FDB error (the closure's own): nothing for FDB to
                // decide. A retryable one gets the store's short backoff
                // and a reset, as FDB's on_error would do.
                None => {
                    if !err.is_retryable() {
                        *self.state() = State::Open(tx);
                        return Err(err);
                    }
                    tokio::time::sleep(crate::store::backoff::BackoffPolicy::FDB.delay(1)).await;
                    let mut tx = tx;
                    tx.reset();
                    Ok(tx)
                }
            },
            State::Gone(why) => {
                *self.state() = State::Gone(why);
                return Err(err);
            }
        };
        let tx = reset?;
        self.versionstamped.store(false, Ordering::Relaxed);
        self.take_deferred();
        *self.state() = State::Open(tx);
        Ok(())
    }
}
