//! Counters of the store's retry loop, for `couch_workers:metrics/0`,
//! and of the restarts of supervised tasks ([`SERVICES`], counted by
//! `services/supervise.rs` directly).
//!
//! Fed from the `transaction` span of the retry loop (`store/retry.rs`):
//! each run records its tally into its span once, when it ends (its
//! `attempts`, `conflicts`, `retries`, and an `outcome` unless its caller
//! dropped it), and the process's subscriber (`log::Process`) adds those
//! fields to [`STORE`]. So a run's outcome is recorded in one place, which
//! tracing and the counters both read. That subscriber takes an interest
//! in that span alone among the spans, so the counters are always on. A
//! host that installs a subscriber of its own before any transaction gets
//! the counters only if it stacks the [`Count`] layer ([`count()`]) among
//! its layers. What the span costs: bench/RESULTS.md, "Session 7: the
//! store's counters from the transaction span".
//!
//! The counts are process-wide atomics (relaxed adds: a counter needs no
//! order with anything else), and take no lock. One Erlang VM runs one
//! node, so a process-wide count is that node's count; test binaries that
//! run several nodes in one process see their sum.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::field::{Field, Visit};
use tracing::span::{Id, Record};
use tracing::{Metadata, Subscriber};
use tracing_subscriber::filter::{filter_fn, Filtered};
use tracing_subscriber::layer::{Context, Layer};

use crate::log::{COMMITTED, TARGET};

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

/// The counting layer, filtered to the retry loop's `transaction` span
/// (a filter of its own: the forwarder beside it wants events only).
pub fn count<S>() -> Filtered<Count, impl tracing_subscriber::layer::Filter<S>, S>
where
    S: Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    Count.with_filter(filter_fn(|m: &Metadata<'_>| m.target() == TARGET && counts_from(m)))
}

/// Whether `meta` (of [`TARGET`]) is the span [`Count`] reads.
pub(crate) fn counts_from(meta: &Metadata<'_>) -> bool {
    meta.is_span() && meta.name() == "transaction"
}

/// The layer that adds each `transaction` span's tally to [`STORE`]. It
/// keeps nothing per span: the loop records each field of its tally once
/// per run, so adding a field's value as it is recorded counts it once.
pub struct Count;

impl<S: Subscriber> Layer<S> for Count {
    fn on_record(&self, _span: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        add_tally(values);
    }
}

/// Adds a recorded tally of a `transaction` span to [`STORE`] (the
/// process's subscriber, `log::Process`, calls it too).
pub(crate) fn add_tally(values: &Record<'_>) {
    values.record(&mut AddTally);
}

/// Adds the recorded fields of a tally to their counters.
struct AddTally;

impl Visit for AddTally {
    fn record_u64(&mut self, field: &Field, value: u64) {
        let counter = match field.name() {
            "attempts" => &STORE.transactions,
            "conflicts" => &STORE.conflicts,
            "retries" => &STORE.retries,
            _ => return,
        };
        counter.fetch_add(value, Ordering::Relaxed);
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "outcome" && value != COMMITTED {
            STORE.failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn record_debug(&mut self, _field: &Field, _value: &dyn fmt::Debug) {}
}

/// Restarts of a node's supervised tasks (`services/supervise.rs`).
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
