//! The one bounded retry loop, used with every store.
//!
//! Modeled on foundationdb-rs `Database::run` and erlfdb's
//! `do_transaction`: run the closure, commit, and on a retryable error let
//! the transaction back off (`on_error`) and run the closure again, within
//! an attempt limit and a total time budget. Closures must be idempotent
//! (they re-read what they change), since a `CommitUnknown` is retried.

use std::future::Future;
use std::time::Instant;

use tracing::field::{Empty, Value};
use tracing::{Instrument, Span};

use super::{CommitInfo, Database, StoreError, Tx, TxOptions};
use crate::log::{self, TARGET};

/// Runs `f` in a transaction of `db` until it commits, retrying what is
/// retryable. `f` gets a fresh transaction on every attempt. The common
/// case of [`run_attempts`], the loop itself: a body that needs to know
/// whether an earlier attempt may have committed, or a caller that needs
/// what the commit told, runs that.
pub async fn run<T, F, Fut>(db: &dyn Database, opts: TxOptions, mut f: F) -> Result<T, StoreError>
where
    F: FnMut(Tx) -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    run_attempts(db, opts, |tx, _| f(tx)).await.map(|(value, _)| value)
}

/// What the retry loop knows when it runs an attempt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Attempt {
    /// An earlier attempt of this call ended in a commit whose outcome is
    /// unknown (`commit_unknown_result`): its writes may be in the store.
    /// A body that is not idempotent by its reads alone checks its own
    /// receipt first (`store::receipt`).
    pub may_have_committed: bool,
}

/// The retry loop: runs `f` as [`run`] does, telling it on each attempt
/// whether an earlier one may have committed, and answers with what the
/// commit told too (its version and versionstamp: the job queue hands
/// each changed job back with the versionstamp of the commit that changed
/// it). A commit still running when the time budget ends
/// is awaited for the store's grace ([`Database::commit_grace`]) and its
/// outcome answered; still undecided then, it is reported `CommitUnknown`
/// (it may land), never `TimedOut`: the caller must not take it for a
/// write that did not happen.
pub async fn run_attempts<T, F, Fut>(
    db: &dyn Database,
    opts: TxOptions,
    mut f: F,
) -> Result<(T, CommitInfo), StoreError>
where
    F: FnMut(Tx, Attempt) -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut seen = Attempt::default();
    // The store's counters are read from this span (`log::Count`): the
    // process's subscriber, which holds that layer, is there before the
    // first transaction even when no node has started.
    log::install();
    let span = tracing::debug_span!(
        target: TARGET,
        "transaction",
        writes = opts.writes,
        attempts = Empty,
        conflicts = Empty,
        retries = Empty,
        outcome = Empty,
        duration_us = Empty
    );
    let mut tally =
        Tally { span: span.clone(), started: Instant::now(), attempts: 0, conflicts: 0, retries: 0, outcome: None };
    let result = match attempt_loop(db, opts, &mut f, &mut seen, &mut tally).instrument(span).await {
        // Out of time after an attempt that may have committed: that
        // commit is the answer's truth, and it is unknown.
        Err(StoreError::TimedOut) if seen.may_have_committed => Err(StoreError::CommitUnknown),
        result => result,
    };
    tally.outcome = Some(result.as_ref().map_or_else(StoreError::name, |_| log::COMMITTED));
    result
}

/// What one run of the loop did, recorded into its `transaction` span
/// once, when the run ends or is dropped unfinished (its caller stopped
/// waiting; then with no `outcome`). This is the one record of a run's
/// outcome: the store's counters are fed from it (`log::Count`), and a
/// host's subscriber sees the same fields.
struct Tally {
    span: Span,
    started: Instant,
    /// Attempts begun.
    attempts: u32,
    /// Attempts that ended in a conflict.
    conflicts: u32,
    /// Attempts that failed retryably and were run again.
    retries: u32,
    /// `committed`, or the error the run gave up with.
    outcome: Option<&'static str>,
}

impl Drop for Tally {
    fn drop(&mut self) {
        let Some(fields) = self.span.metadata().map(|m| m.fields()) else { return };
        let field = |name| fields.field(name).expect("a field of the transaction span");
        let duration_us = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        // One record of every field: one call into the subscriber.
        self.span.record_all(&fields.value_set(&[
            (&field("attempts"), Some(&self.attempts as &dyn Value)),
            (&field("conflicts"), Some(&self.conflicts as &dyn Value)),
            (&field("retries"), Some(&self.retries as &dyn Value)),
            (&field("duration_us"), Some(&duration_us as &dyn Value)),
            (&field("outcome"), self.outcome.as_ref().map(|o| o as &dyn Value)),
        ]));
    }
}

async fn attempt_loop<T, F, Fut>(
    db: &dyn Database,
    opts: TxOptions,
    f: &mut F,
    seen: &mut Attempt,
    tally: &mut Tally,
) -> Result<(T, CommitInfo), StoreError>
where
    F: FnMut(Tx, Attempt) -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    // The budget on tokio's clock, the one its timeouts and sleeps wait
    // on: on std's, a test runtime with a paused clock (whose timers all
    // fire as soon as every task waits) saw a writer queued behind a held
    // lock fail its lock wait again and again within a millisecond of
    // real time, and answer `RetryLimit` after 100 attempts instead of
    // `TimedOut` at its budget (`embedded_commit_truth`, 10 of 10 in a
    // release build). The same monotonic clock in a normal runtime.
    let started = tokio::time::Instant::now();
    let policy = db.backoff_policy();
    let mut attempts: u32 = 0;
    loop {
        attempts += 1;
        tally.attempts = attempts;
        let remaining = opts.timeout.checked_sub(started.elapsed()).ok_or(StoreError::TimedOut)?;
        // Set once the attempt hands its writes to the store.
        let committing = std::sync::atomic::AtomicBool::new(false);
        let told = *seen;
        let attempt = async {
            let tx = match db.create_transaction(&opts).await {
                Ok(tx) => tx,
                Err(e) => return Err((None, e)),
            };
            let result = match f(tx.clone(), told).await {
                Ok(value) => {
                    committing.store(true, std::sync::atomic::Ordering::Relaxed);
                    tx.commit().await.map(|info| (value, info))
                }
                Err(e) => Err(e),
            };
            result.map_err(|e| (Some(tx), e))
        };
        let mut attempt = std::pin::pin!(attempt);
        let (tx, err): (Option<Tx>, StoreError) = match tokio::time::timeout(remaining, &mut attempt).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(failed)) => failed,
            Err(_) if committing.load(std::sync::atomic::Ordering::Relaxed) => {
                return outcome_after_budget(attempt, db.commit_grace(opts.timeout)).await
            }
            Err(_) => return Err(StoreError::TimedOut),
        };
        if err == StoreError::CommitUnknown {
            seen.may_have_committed = true;
        }
        if err == StoreError::Conflict {
            tally.conflicts += 1;
        }
        if !err.is_retryable() {
            return Err(err);
        }
        if attempts >= opts.retry_limit {
            return Err(StoreError::RetryLimit { attempts, last: Box::new(err) });
        }
        tally.retries += 1;
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

/// The budget ended while the attempt was in its commit. Dropping the
/// commit would leave the answer unknown, while the store may still decide
/// it (the embedded store's group commit commits or fails a member's
/// writes whether or not the member still waits): so the commit is awaited
/// for the grace the store declares ([`Database::commit_grace`]), and its
/// outcome is the answer. With no time left there is no retry: a commit
/// that failed retryably did not land (`TimedOut`, which `run_attempts`
/// turns into `CommitUnknown` if an earlier attempt may have landed); one
/// that failed for good answers its error. Only a commit still undecided
/// when the grace ends answers `CommitUnknown`.
async fn outcome_after_budget<V, Fut>(
    attempt: std::pin::Pin<&mut Fut>,
    grace: std::time::Duration,
) -> Result<V, StoreError>
where
    Fut: Future<Output = Result<V, (Option<Tx>, StoreError)>>,
{
    if grace.is_zero() {
        // The store declares none (FoundationDB): not even one more poll.
        return Err(StoreError::CommitUnknown);
    }
    match tokio::time::timeout(grace, attempt).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err((_, StoreError::CommitUnknown))) | Err(_) => Err(StoreError::CommitUnknown),
        Ok(Err((_, err))) if err.is_retryable() => Err(StoreError::TimedOut),
        Ok(Err((_, err))) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use std::future::{pending, ready, Future};
    use std::time::Duration;

    use super::{outcome_after_budget, StoreError, Tx};

    type Failed = (Option<Tx>, StoreError);

    async fn answer<F: Future<Output = Result<u8, Failed>>>(commit: F, grace: Duration) -> Result<u8, StoreError> {
        outcome_after_budget(std::pin::pin!(commit), grace).await
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_decided_within_the_grace_answers_its_outcome() {
        let grace = Duration::from_millis(50);
        assert_eq!(answer(ready(Ok(7)), grace).await, Ok(7), "landed: its value");
        let io = StoreError::Io("disk".into());
        assert_eq!(answer(ready(Err((None, io.clone()))), grace).await, Err(io), "failed for good: its error");
        // Failed retryably with no time left for a retry: not committed.
        assert_eq!(answer(ready(Err((None, StoreError::Conflict))), grace).await, Err(StoreError::TimedOut));
        assert_eq!(answer(ready(Err((None, StoreError::Busy))), grace).await, Err(StoreError::TimedOut));
        // The store itself did not know.
        assert_eq!(answer(ready(Err((None, StoreError::CommitUnknown))), grace).await, Err(StoreError::CommitUnknown));
        // Decided late but within the grace.
        let late = async {
            tokio::time::sleep(grace / 2).await;
            Ok(1)
        };
        assert_eq!(answer(late, grace).await, Ok(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_undecided_after_the_grace_or_with_none_is_unknown() {
        let started = tokio::time::Instant::now();
        assert_eq!(answer(pending(), Duration::from_millis(50)).await, Err(StoreError::CommitUnknown));
        assert_eq!(started.elapsed(), Duration::from_millis(50), "waited the grace, no longer");
        // No grace (FoundationDB): unknown at once, the commit not polled
        // again even when it would be ready.
        assert_eq!(answer(ready(Ok(1)), Duration::ZERO).await, Err(StoreError::CommitUnknown));
    }
}
