//! Counters of the store's retry loop, for `couch_workers:metrics/0`,
//! and of the restarts of supervised tasks ([`SERVICES`], counted by
//! `tasks/supervise.rs` directly).
//!
//! The store's counters are fed from the `transaction` span of the retry
//! loop (`store/retry.rs`): each run records its tally into its span once,
//! when it ends (its `attempts`, `conflicts`, `retries`, and an `outcome`
//! unless its caller dropped it), and the log's counting layer
//! (`log::Count`, in the process's subscriber `log::Process` too) adds
//! those fields to [`STORE`]. So a run's outcome is recorded in one place,
//! which tracing and the counters both read; this module knows nothing of
//! tracing. What the span costs: bench/RESULTS.md, "The store's counters
//! from the transaction span".
//!
//! The counts are process-wide atomics (relaxed adds: a counter needs no
//! order with anything else), and take no lock. One Erlang VM runs one
//! node, so a process-wide count is that node's count; test binaries that
//! run several nodes in one process see their sum.

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

/// Restarts of a node's supervised tasks (`tasks/supervise.rs`).
#[derive(Debug, Default)]
pub struct ServiceCounters {
    /// Runs of a supervised task that panicked or ended unexpectedly (each
    /// is restarted).
    pub restarted: AtomicU64,
    /// Failing episodes: a task restarted `FAILING_RESTARTS` times within
    /// `FAILING_WINDOW` (reported to the owners it serves).
    pub failing: AtomicU64,
}

/// A copy of the service counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServiceCounts {
    pub restarted: u64,
    pub failing: u64,
}

pub static SERVICES: ServiceCounters = ServiceCounters { restarted: AtomicU64::new(0), failing: AtomicU64::new(0) };

impl ServiceCounters {
    pub fn snapshot(&self) -> ServiceCounts {
        ServiceCounts {
            restarted: self.restarted.load(Ordering::Relaxed),
            failing: self.failing.load(Ordering::Relaxed),
        }
    }
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
