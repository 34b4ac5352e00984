//! The job queue's key-space operations, each run inside a transaction of
//! the caller's (the service's retry loop, `roster::remove`, the tests).
//!
//! Every function re-reads what it changes, so that a retried attempt
//! (conflict, commit-unknown) decides afresh. An expected outcome
//! (`not_found`, `already_exists`, `not_owner`, `canceled`) is a value,
//! `Ok(Err(Error))`: the transaction still commits (a `canceled` update
//! writes the cancellation); only store failures are `Err(StoreError)`.
//!
//! Invariants kept by every function here, in the same transaction as the
//! change that needs them:
//!
//! * a job is pending ⇔ it has exactly one pending key, whose VS equals
//!   its record's VS and whose priority equals its record's priority;
//! * the pending count is the number of pending keys: every set or clear
//!   of a pending key comes with `atomic_add(count, ±1)`;
//! * a job is running ⇔ its record names the worker and an accept token,
//!   and the active key `(WorkerType, Worker, JobId)` exists;
//! * whenever a job becomes pending, `jobs_vs` of its type is bumped (one
//!   bump per transaction), which wakes every node's dispatcher.
//!
//! Batches are bounded (FoundationDB's 10 MB / 5 s transaction limits
//! hold on every store): requeueing a worker's jobs handles at most
//! [`REQUEUE_MAX_JOBS`] jobs or [`BATCH_WRITE_BUDGET`] bytes per
//! transaction and leaves the rest to the sweeper behind an orphan marker;
//! an accept round stops at the same byte budget; `add_many` refuses a
//! batch that could not fit one transaction.
//!
//! ## Modules
//!
//! * `helpers`: the reads and key checks every operation shares;
//! * `run_end`: how a run ends ([`RunEnd`], [`Retry`]) and the one function
//!   that moves a running job off its worker;
//! * `lifecycle`: add, add_many, update, finish/fail/release, cancel, remove;
//! * `accept`: the accept round, the pending watch, due jobs to pending;
//! * `reclaim`: jobs an accept took whose handles nobody got;
//! * `resubmit`: add the job or run it again;
//! * `requeue`: failover of a removed worker's jobs, and the orphan sweep;
//! * `query`: one job, counts, types, pages; `pause`; `prune`;
//! * `type_settings`: a type's settings, read and changed;
//! * `take_back`: a running job taken back for its activity timeout;
//! * `unique`: a job's unique key, claimed while it is queued or running.

mod accept;
mod helpers;
mod lifecycle;
mod pause;
mod prune;
mod query;
mod reclaim;
mod requeue;
mod resubmit;
mod run_end;
mod take_back;
mod type_settings;
mod unique;

pub use accept::{accept, new_tokens, promote_due, round_version, round_watch, Acceptors, Claims, Take};
// For the tests that arm the accept watch by hand.
#[cfg(feature = "internals")]
pub use accept::{pending_version, pending_watch};
// For the contention tests' takes (`tests/jobs_take_contention.rs`).
#[cfg(feature = "internals")]
pub use accept::Claimed;
pub use helpers::check_job_key;
pub use lifecycle::{add, add_job, add_many, add_many_jobs, cancel, end, finish, remove, remove_if, update};
pub use pause::set_paused;
pub use prune::{clear_idle_groups, idle_groups_ahead, next_expiry, prune, GroupsSwept, Pruned};
pub use query::{counts, get, get_with_history, job_types, list, next_run_at, pending_count};
pub use reclaim::{give_back, reclaim};
pub use requeue::{orphans, requeue_worker_jobs, sweep_orphan, Departure, SweepCursor, SweepStep};
// The failover's batch bound, which tests fill exactly.
#[cfg(feature = "internals")]
pub use requeue::REQUEUE_MAX_JOBS;
pub use resubmit::resubmit;
pub use run_end::{Retry, RunEnd};
pub use take_back::{clear_if_stale, take_back, Due, TakeBack};
pub use type_settings::{set_type_settings, type_settings};

use crate::error::Error;

/// An expected outcome of an operation (see the module comment).
pub type OpResult<T> = Result<T, Error>;

/// Most bytes (keys and values written) that one batch of requeues or
/// accepts may write: a fifth of FoundationDB's 10 MB, so that the
/// transaction that removes a worker has room for its own writes, and a
/// batch of big records stays far from the limit.
pub const BATCH_WRITE_BUDGET: usize = 2_000_000;
