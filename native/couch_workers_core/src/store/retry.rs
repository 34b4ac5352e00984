//! The one bounded retry loop, used with every store.
//!
//! Modeled on foundationdb-rs `Database::run` and erlfdb's
//! `do_transaction`: run the closure, commit, and on a retryable error let
//! the transaction back off (`on_error`) and run the closure again, within
//! an attempt limit and a total time budget. Closures must be idempotent
//! (they re-read what they change), since a `CommitUnknown` is retried.

use std::future::Future;
use std::time::Instant;

use tracing::field::Empty;
use tracing::{Instrument, Span};

use super::{CommitInfo, Database, StoreError, Tx, TxOptions};
use crate::log::TARGET;
use crate::metrics;

/// Runs `f` in a transaction of `db` until it commits, retrying what is
/// retryable. `f` gets a fresh transaction on every attempt.
pub async fn run<T, F, Fut>(db: &dyn Database, opts: TxOptions, f: F) -> Result<T, StoreError>
where
    F: FnMut(Tx) -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    run_with_info(db, opts, f).await.map(|(value, _)| value)
}

/// [`run`], also returning what the commit told (its version and
/// versionstamp): the job queue hands each changed job back with the
/// versionstamp of the commit that changed it.
pub async fn run_with_info<T, F, Fut>(db: &dyn Database, opts: TxOptions, mut f: F) -> Result<(T, CommitInfo), StoreError>
where
    F: FnMut(Tx) -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    run_attempts(db, opts, |tx, _| f(tx)).await
}

/// What the retry loop knows when it runs an attempt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Attempt {
    /// An earlier attempt of this call ended in a commit whose outcome is
    /// unknown (`commit_unknown_result`): its writes may be in the store.
    /// A body that is not idempotent by its reads alone checks its own
    /// receipt first (`jobs::receipt`).
    pub may_have_committed: bool,
}

/// [`run_with_info`], telling `f` on each attempt whether an earlier one
/// may have committed. A commit still running when the time budget ends
/// is reported `CommitUnknown` (it may land), never `TimedOut`: the
/// caller must not take it for a write that did not happen.
pub async fn run_attempts<T, F, Fut>(db: &dyn Database, opts: TxOptions, mut f: F) -> Result<(T, CommitInfo), StoreError>
where
    F: FnMut(Tx, Attempt) -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut seen = Attempt::default();
    // Disabled unless a subscriber wants it (log.rs): then recording costs
    // nothing but a check.
    let span = tracing::debug_span!(
        target: TARGET,
        "transaction",
        writes = opts.writes,
        attempts = Empty,
        outcome = Empty,
        duration_us = Empty
    );
    let started = Instant::now();
    let result = match attempt_loop(db, opts, &mut f, &mut seen, &span).instrument(span.clone()).await {
        // Out of time after an attempt that may have committed: that
        // commit is the answer's truth, and it is unknown.
        Err(StoreError::TimedOut) if seen.may_have_committed => Err(StoreError::CommitUnknown),
        result => result,
    };
    if result.is_err() {
        metrics::bump(&metrics::STORE.failures);
    }
    if !span.is_disabled() {
        span.record("outcome", result.as_ref().map_or_else(StoreError::name, |_| "committed"));
        span.record("duration_us", u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX));
    }
    result
}

async fn attempt_loop<T, F, Fut>(
    db: &dyn Database,
    opts: TxOptions,
    f: &mut F,
    seen: &mut Attempt,
    span: &Span,
) -> Result<(T, CommitInfo), StoreError>
where
    F: FnMut(Tx, Attempt) -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let started = Instant::now();
    let policy = db.backoff_policy();
    let mut attempts: u32 = 0;
    loop {
        attempts += 1;
        metrics::bump(&metrics::STORE.transactions);
        span.record("attempts", attempts);
        let remaining = opts.timeout.checked_sub(started.elapsed()).ok_or(StoreError::TimedOut)?;
        // Set once the attempt hands its writes to the store.
        let committing = std::sync::atomic::AtomicBool::new(false);
        let attempt = async {
            let tx = match db.create_transaction(&opts).await {
                Ok(tx) => tx,
                Err(e) => return Err((None, e)),
            };
            let result = match f(tx.clone(), *seen).await {
                Ok(value) => {
                    committing.store(true, std::sync::atomic::Ordering::Relaxed);
                    tx.commit().await.map(|info| (value, info))
                }
                Err(e) => Err(e),
            };
            result.map_err(|e| (Some(tx), e))
        };
        let (tx, err): (Option<Tx>, StoreError) = match tokio::time::timeout(remaining, attempt).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(failed)) => failed,
            // Dropped in its commit: the store may still apply it (the
            // embedded store's group commit does).
            Err(_) if committing.load(std::sync::atomic::Ordering::Relaxed) => return Err(StoreError::CommitUnknown),
            Err(_) => return Err(StoreError::TimedOut),
        };
        if err == StoreError::CommitUnknown {
            seen.may_have_committed = true;
        }
        if err == StoreError::Conflict {
            metrics::bump(&metrics::STORE.conflicts);
        }
        if !err.is_retryable() {
            return Err(err);
        }
        if attempts >= opts.retry_limit {
            return Err(StoreError::RetryLimit { attempts, last: Box::new(err) });
        }
        metrics::bump(&metrics::STORE.retries);
        if let Some(tx) = tx {
            // The store's own backoff (FDB's on_error doubles its delay).
            let remaining = opts.timeout.checked_sub(started.elapsed()).ok_or(StoreError::TimedOut)?;
            match tokio::time::timeout(remaining, tx.on_error(err)).await {
                Ok(Ok(())) => {
                    // Each attempt runs on a fresh transaction, so the
                    // store's own backoff never grows past its first step
                    // (FDB: up to 10 ms); the loop adds the growth, on the
                    // store's schedule (FDB's: doubling up to 1 s).
                    if attempts > 1 {
                        tokio::time::sleep(policy.delay(attempts)).await;
                    }
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(StoreError::TimedOut),
            }
        } else {
            // No transaction to back off with (the store was busy opening
            // one): the store's jittered schedule.
            tokio::time::sleep(policy.delay(attempts)).await;
        }
    }
}
