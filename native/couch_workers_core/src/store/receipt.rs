//! The retry-safe write: how a write answers for itself after
//! `commit_unknown_result`, written once ([`RetrySafe`], [`run_retry_safe`])
//! for every write that needs it (the job writes of `jobs::commit`,
//! `jobs::finish_next` and `jobs::Jobs::update`, a heartbeat's
//! reinstatement, a reap, the node's removals and replacements of
//! workers, the give-back of a job whose delivery failed and the reclaim
//! of an accept round that failed, each retried until it lands:
//! [`RetriedWrite`]). Its key is the key space's receipt key: the key space packs it
//! (`keyspace/` implements [`ReceiptKeys`]), the store layer below it
//! only uses it.
//!
//! FoundationDB may answer 1021 for a commit that happened, and the retry
//! loop runs the body again. For most job writes the state alone cannot
//! tell "my earlier attempt did this" from "someone else did": a job that
//! exists may be another caller's `add`, a finished job may have been
//! finished by this call or taken away and finished by another worker. So
//! each write draws a random token outside the retry loop and, when it
//! writes anything, also sets the receipt key of that token in the same
//! transaction. An attempt that follows one which may have committed
//! (`Attempt::may_have_committed`) reads the receipt first: present, the
//! earlier attempt landed, and the call answers as that attempt would
//! have, writing nothing more. Reaps and the node's removals and
//! replacements of workers set one too, holding how many jobs they failed
//! over ([`count_outcome`]): their retry finds the worker gone either way.
//! A heartbeat that registers a reaped worker again sets one naming the
//! registrations it reinstated (`services/heartbeat.rs`): its retry finds
//! them registered, and their owners must still be told.
//!
//! Only on stores whose commits may answer `commit_unknown_result`
//! (`Database::commits_may_be_unknown`: FoundationDB, `sim`, the faulty
//! test wrapper); the embedded store knows every commit's outcome and
//! writes none. Cost: one small key (about 50 bytes) set per job write and
//! no extra read on a first attempt (figures in bench/RESULTS.md). Cleanup: each node's pruner clears, with one
//! blind range clear a minute, every receipt written more than
//! [`KEEP_MINUTES`] minutes ago by the writer's clock (far longer than any
//! call's retry budget; a writer whose clock lags by more than that may
//! lose its receipt early, and then answers as without one).

use std::future::Future;

use rand::RngCore;

use super::{run_attempts, Attempt, CommitInfo, Database, StoreError, Tx, TxOptions};

/// Where receipts are kept. The key space packs every key
/// (`keyspace/` implements this); the retry-safe write, in the store
/// layer below it, asks it for the keys it writes and clears.
pub trait ReceiptKeys: Send + Sync {
    /// The key of receipt `token`, written in Unix minute `minute`.
    fn receipt(&self, minute: i64, token: &[u8]) -> Vec<u8>;
    /// The range of every receipt written in a minute before `minute`.
    fn receipts_before(&self, minute: i64) -> (Vec<u8>, Vec<u8>);
}

/// How long a receipt is kept, in minutes of the writer's wall clock.
pub const KEEP_MINUTES: i64 = 10;

/// What a landed write reported.
pub(crate) const DONE: &[u8] = b"done";
/// An update that found a cancel request and wrote the cancellation.
pub(crate) const CANCELED: &[u8] = b"canceled";

/// A landed write that moved `n` jobs (a reap, an owner's exit, a
/// replacing registration): what it failed over, for the node's metrics.
pub(crate) fn count_outcome(n: usize) -> Vec<u8> {
    u64::try_from(n).unwrap_or(u64::MAX).to_be_bytes().to_vec()
}

/// The count of a [`count_outcome`] (0 for any other outcome).
pub(crate) fn parse_count(outcome: &[u8]) -> usize {
    <[u8; 8]>::try_from(outcome).map_or(0, |b| usize::try_from(u64::from_be_bytes(b)).unwrap_or(usize::MAX))
}

/// The current Unix minute of this node's wall clock.
pub fn minute_now() -> i64 {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
    i64::try_from(ms / 60_000).unwrap_or(i64::MAX)
}

/// One call's receipt, the same key on every attempt of the call; none on
/// a store whose commits are never unknown.
pub(crate) struct RetrySafe {
    key: Option<Vec<u8>>,
}

impl RetrySafe {
    /// A fresh receipt for one call (made outside the retry loop).
    pub(crate) fn new(db: &dyn Database, ks: &dyn ReceiptKeys) -> RetrySafe {
        // No receipt where every commit's outcome is known (the retry
        // never runs on top of a landed commit).
        let key = db.commits_may_be_unknown().then(|| {
            let mut token = [0u8; 16];
            rand::rng().fill_bytes(&mut token);
            ks.receipt(minute_now(), &token)
        });
        RetrySafe { key }
    }

    /// Runs one attempt of the call on `tx`. `body` gets what an earlier
    /// attempt of this call recorded, if one may have committed and did
    /// (its receipt), and returns its value and what to record (`None`:
    /// it wrote nothing a retry must know of). The receipt is read before
    /// the body runs and written in the body's transaction. The read is
    /// not a snapshot read: a receipt being written concurrently (the
    /// earlier attempt still in flight) makes this attempt conflict.
    pub(crate) async fn attempt<T, B, Fut>(&self, tx: &Tx, attempt: Attempt, body: B) -> Result<T, StoreError>
    where
        B: FnOnce(Option<Vec<u8>>) -> Fut,
        Fut: Future<Output = Result<(T, Option<Vec<u8>>), StoreError>>,
    {
        let landed = match self.key.as_ref().filter(|_| attempt.may_have_committed) {
            Some(key) => tx.get(key, false).await?,
            None => None,
        };
        let (value, outcome) = body(landed).await?;
        if let (Some(key), Some(outcome)) = (&self.key, outcome) {
            tx.set(key, &outcome);
        }
        Ok(value)
    }
}

/// [`run_attempts`] of a retry-safe write: each attempt runs through one
/// [`RetrySafe`] (see [`RetrySafe::attempt`] for `body`).
pub(crate) async fn run_retry_safe<T, F, Fut>(
    db: &dyn Database,
    opts: TxOptions,
    ks: &dyn ReceiptKeys,
    body: F,
) -> Result<(T, CommitInfo), StoreError>
where
    F: Fn(Tx, Option<Vec<u8>>) -> Fut,
    Fut: Future<Output = Result<(T, Option<Vec<u8>>), StoreError>>,
{
    RetriedWrite::new(db, ks).run(db, opts, body).await
}

/// A retry-safe write that its caller may run the retry loop for more
/// than once (a give-back retried with backoff until it lands): every run
/// uses the same receipt, and a run after one that ended
/// `CommitUnknown` reads it on its first attempt too, since that earlier
/// run's last commit may have landed.
pub(crate) struct RetriedWrite {
    safe: RetrySafe,
    /// A run ended `CommitUnknown`.
    unknown: bool,
}

impl RetriedWrite {
    /// A fresh receipt for one write (made outside every run).
    pub(crate) fn new(db: &dyn Database, ks: &dyn ReceiptKeys) -> RetriedWrite {
        RetriedWrite { safe: RetrySafe::new(db, ks), unknown: false }
    }

    /// One run of the retry loop ([`run_retry_safe`]'s, for `body`).
    pub(crate) async fn run<T, F, Fut>(
        &mut self,
        db: &dyn Database,
        opts: TxOptions,
        body: F,
    ) -> Result<(T, CommitInfo), StoreError>
    where
        F: Fn(Tx, Option<Vec<u8>>) -> Fut,
        Fut: Future<Output = Result<(T, Option<Vec<u8>>), StoreError>>,
    {
        let (safe, earlier, body) = (&self.safe, self.unknown, &body);
        let result = run_attempts(db, opts, move |tx, attempt| async move {
            let attempt = Attempt { may_have_committed: attempt.may_have_committed || earlier };
            safe.attempt(&tx.clone(), attempt, |landed| body(tx, landed)).await
        })
        .await;
        if matches!(result, Err(StoreError::CommitUnknown)) {
            self.unknown = true;
        }
        result
    }
}

/// Clears every receipt older than [`KEEP_MINUTES`] by `minute`.
pub fn clear_old(tx: &Tx, ks: &dyn ReceiptKeys, minute: i64) {
    let (begin, end) = ks.receipts_before(minute - KEEP_MINUTES);
    tx.clear_range(&begin, &end);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::store::sim::{CommitFault, SimOptions, SimStore};

    struct Keys;
    impl ReceiptKeys for Keys {
        fn receipt(&self, minute: i64, token: &[u8]) -> Vec<u8> {
            let mut key = b"receipt/".to_vec();
            key.extend_from_slice(&minute.to_be_bytes());
            key.extend_from_slice(token);
            key
        }
        fn receipts_before(&self, _minute: i64) -> (Vec<u8>, Vec<u8>) {
            (b"receipt/".to_vec(), b"receipt0".to_vec())
        }
    }

    /// A run that ends `CommitUnknown` after its write landed (its later
    /// attempts kept failing until the budget ended): the next run of the
    /// same write finds its receipt on its first attempt, and writes
    /// nothing again.
    #[tokio::test]
    async fn a_later_run_reads_the_receipt_of_a_run_that_ended_unknown() {
        let sim = SimStore::new(SimOptions::new(5));
        let db: &dyn Database = sim.as_ref();
        let mut write = RetriedWrite::new(db, &Keys);
        let opts = TxOptions { timeout: Duration::from_millis(200), ..TxOptions::write() };
        let bodies = AtomicU32::new(0);
        sim.inject_commit_fault(CommitFault::UnknownCommitted);
        let first = write
            .run(db, opts, |tx, landed| {
                let n = bodies.fetch_add(1, Ordering::SeqCst);
                async move {
                    assert!(landed.is_none() || n > 0);
                    if n > 0 {
                        // Every attempt after the landed one fails until
                        // the budget ends.
                        return Err(StoreError::Busy);
                    }
                    tx.atomic_add(b"count", 1);
                    Ok(((), Some(DONE.to_vec())))
                }
            })
            .await;
        assert_eq!(first.map(|_| ()), Err(StoreError::CommitUnknown));
        let second = write
            .run(db, opts, |tx, landed| async move {
                if landed.is_some() {
                    return Ok((true, None));
                }
                tx.atomic_add(b"count", 1);
                Ok((false, Some(DONE.to_vec())))
            })
            .await
            .expect("second run");
        assert!(second.0, "the second run found the first run's receipt");
        let count = crate::store::run(db, TxOptions::read(), |tx| async move { tx.get(b"count", false).await })
            .await
            .expect("read");
        assert_eq!(count, Some(1i64.to_le_bytes().to_vec()), "added once");
    }
}
