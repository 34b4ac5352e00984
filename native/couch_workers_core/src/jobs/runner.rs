//! [`crate::store::run`], returning the commit's [`CommitInfo`] as well.
//!
//! The queue returns each changed job with its new versionstamp, which is
//! only known once the commit has happened; `store::run` keeps the
//! `CommitInfo` to itself. This is the same bounded loop (same budget,
//! same retry rule, same backoff) with the commit's info handed back.
//! It belongs in `store/retry.rs` (`run` = this minus the info); it lives
//! here only because that file is not the queue's to change.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::store::{CommitInfo, Database, StoreError, Tx, TxOptions};

/// Runs `f` in a transaction of `db` until it commits (see
/// [`crate::store::run`]); returns its value and the commit's info.
pub(crate) async fn run_committed<T, F, Fut>(db: &dyn Database, opts: TxOptions, mut f: F) -> Result<(T, CommitInfo), StoreError>
where
    F: FnMut(Tx) -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let started = Instant::now();
    let mut attempts: u32 = 0;
    loop {
        attempts += 1;
        let remaining = opts.timeout.checked_sub(started.elapsed()).ok_or(StoreError::TimedOut)?;
        let attempt = async {
            let tx = match db.create_transaction(&opts).await {
                Ok(tx) => tx,
                Err(e) => return Err((None, e)),
            };
            let result = match f(tx.clone()).await {
                Ok(value) => tx.commit().await.map(|info| (value, info)),
                Err(e) => Err(e),
            };
            result.map_err(|e| (Some(tx), e))
        };
        let (tx, err): (Option<Tx>, StoreError) = match tokio::time::timeout(remaining, attempt).await {
            Ok(Ok(done)) => return Ok(done),
            Ok(Err(failed)) => failed,
            Err(_) => return Err(StoreError::TimedOut),
        };
        if !err.is_retryable() {
            return Err(err);
        }
        if attempts >= opts.retry_limit {
            return Err(StoreError::RetryLimit { attempts, last: Box::new(err) });
        }
        if let Some(tx) = tx {
            let remaining = opts.timeout.checked_sub(started.elapsed()).ok_or(StoreError::TimedOut)?;
            match tokio::time::timeout(remaining, tx.on_error(err)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(StoreError::TimedOut),
            }
        } else {
            tokio::time::sleep(backoff(attempts)).await;
        }
    }
}

/// `store::retry`'s backoff: up to 1 ms doubled per attempt, capped at
/// 100 ms, full jitter.
fn backoff(attempts: u32) -> Duration {
    use rand::Rng;
    let ceiling_us = (1_000u64 << attempts.min(7)).min(100_000);
    Duration::from_micros(rand::rng().random_range(ceiling_us / 4..=ceiling_us))
}

/// The commit's versionstamp, which every transaction that wrote a job
/// record has (the record's VS is a versionstamped value).
pub(crate) fn commit_vs(info: &CommitInfo) -> Result<crate::store::Versionstamp, StoreError> {
    info.versionstamp
        .ok_or_else(|| StoreError::Invalid("the store reported no versionstamp for a versionstamped commit".into()))
}
