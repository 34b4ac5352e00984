//! Counters of the store's retry loop, for `couch_workers:metrics/0`.
//!
//! Kept in process-wide atomics (relaxed adds: a counter needs no order
//! with anything else), bumped by `store::run`, so that counting costs a
//! few nanoseconds and takes no lock. One Erlang VM runs one node, so a
//! process-wide count is that node's count; test binaries that run several
//! nodes in one process see their sum.

use std::sync::atomic::{AtomicU64, Ordering};

/// What the retry loop did since the process started.
#[derive(Debug, Default)]
pub struct StoreCounters {
    /// Transaction attempts begun (every retry is one more).
    pub transactions: AtomicU64,
    /// Attempts that ended in a conflict with another transaction.
    pub conflicts: AtomicU64,
    /// Attempts that failed retryably and were run again.
    pub retries: AtomicU64,
    /// Runs that gave up with an error (not retryable, or out of budget).
    pub failures: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreCounts {
    pub transactions: u64,
    pub conflicts: u64,
    pub retries: u64,
    pub failures: u64,
}

pub static STORE: StoreCounters = StoreCounters {
    transactions: AtomicU64::new(0),
    conflicts: AtomicU64::new(0),
    retries: AtomicU64::new(0),
    failures: AtomicU64::new(0),
};

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl StoreCounters {
    pub fn snapshot(&self) -> StoreCounts {
        StoreCounts {
            transactions: self.transactions.load(Ordering::Relaxed),
            conflicts: self.conflicts.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
        }
    }
}
