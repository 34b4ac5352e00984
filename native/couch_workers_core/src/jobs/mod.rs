//! The job queue: jobs of type T are taken by workers of type T.
//!
//! ## Data model
//!
//! The job queue's keys and values (records, `pending`, `scheduled`,
//! `active`, `counts`, `by_state`, `types`, `expiry`, `paused`, the `_vs`
//! keys, orphan markers, receipts): `docs/keyspace.md`. Each state's keys
//! are written in one place, `place.rs`: every state change is `unplace`
//! of the old record, then `place` of the new one, in one transaction, so
//! the counts are exact.
//!
//! ## Transitions
//!
//! ```text
//!             ┌──────────── run_at passes ───────────┐
//!             │                                      ▼
//! add ──► scheduled ◄── fail (retry) / release ── pending ──accept──► running ──finish──► finished
//!  │          │            (with a delay)          ▲  │                │ │ │
//!  └──────────┼────────────────────────────────────┘  │ cancel         │ │ └─ fail, attempts spent / retry false ─► failed
//!             │ cancel                                ▼                │ └─── update with a cancel request ──► canceled
//!             └──────────────────────────────────► canceled            └── fail (retry) / release / death ──► pending or scheduled
//! resubmit: absent → add; queued → new info and options; running → queued again when the run ends;
//!           ended (finished, canceled, failed) → queued, attempts 0.
//! keep: an ended job's expiry; the pruner removes it. remove: from any state, every key goes.
//! ```
//!
//! ## Modules
//!
//! * [`record`]: the stored values' encoding (formats: `docs/keyspace.md`);
//! * [`ops`]: the transactional operations over `&Tx` (the only code that
//!   writes job keys), one module per seam: `lifecycle` (add, update, end,
//!   cancel, remove), `accept`, `reclaim`, `resubmit`, `requeue` (failover
//!   and the orphan sweep), `query`, `pause`, `prune`;
//! * [`dispatcher`]: the per-(node, type) accept dispatcher (no thundering
//!   herd: one watch per node and type, one transaction per round);
//! * [`subscription`]: job watchers shared per (node, job);
//! * `place.rs`: the keys and counters of each state (the one writer);
//! * `commit.rs`: a job write run to its commit: the once-only run of an
//!   `Ok(())` write (add, resubmit, remove: its receipt) and the commit's
//!   versionstamp in the answer;
//! * `finish_next.rs`: a finish and the worker's next accept in one
//!   transaction (`job_finish_accept/3`);
//! * [`sweeper`]: finishes the failover of workers removed with more
//!   running jobs than one transaction may move;
//! * `pruner.rs`: removes ended jobs past their `keep`;
//! * `wake.rs`: the promoter's and the pruner's wait (a deadline or a
//!   watched key's change);
//! * `in_tx.rs`: [`TxJobs`], calls inside a caller's FoundationDB
//!   transaction (`store::forward`);
//! * [`tx_counts`]: those calls counted once, when the caller commits;
//! * `take.rs`: one accept now (timeout 0), no dispatcher;
//! * `api.rs`: [`Jobs`], the stateless job API on a context (every call
//!   that needs no running task; the command line's);
//! * [`history`]: a job's last runs, written by the accept and the run's
//!   end (`place.rs`, `ops/run_end.rs`);
//! * [`type_settings`]: a type's stored settings (timeouts, limits) and
//!   `type_api.rs`, their calls on [`Jobs`];
//! * [`service`]: [`JobService`], the node's: [`Jobs`] plus accept and
//!   subscribe, and the daemons only a node starts.
//!
//! Dependencies run down this list's reverse: `service` uses `api`,
//! `finish_next`, `take`, `subscription`, `dispatcher`, `promoter`,
//! `pruner`, `sweeper`; none of those uses `service`. Each task takes the
//! node's [`crate::context::Context`] and its own registry.

mod activity;
mod api;
mod commit;
pub mod dispatcher;
mod finish_next;
mod in_tx;
mod limits;
pub mod history;
pub mod job;
pub mod ops;
pub(crate) mod place;
mod promoter;
mod pruner;
pub mod record;
pub mod service;
pub mod subscription;
mod sweeper;
mod take;
mod type_api;
pub mod type_settings;
pub mod tx_counts;
mod wake;

pub use api::Jobs;
pub use dispatcher::{AcceptReply, GoneSignal};
#[cfg(feature = "internals")]
pub use dispatcher::ReplyFn;
pub use finish_next::NextFor;
pub use in_tx::TxJobs;
pub use job::{
    AcceptToken, ActivityTimeout, AddManyError, Fence, Job, JobEvent, JobHandle, JobOpts, JobSpec, JobState, JobVs, Keep, MaxAttempts,
    Schedule,
};
// What only tests build jobs and clocks with.
#[cfg(feature = "internals")]
pub use job::NewJob;
#[cfg(feature = "internals")]
pub use place::wall_ms;
pub use ops::{Departure, Retry};
pub use service::{JobService, JobStats};
pub use subscription::{JobSubscription, OnJobEvent};
pub use type_settings::{TypeSetting, TypeSettings};

use crate::keyspace::Keyspace;
use crate::store::{StoreError, Tx};

/// Ends the run of every job that `worker` of `worker_type` is running,
/// in the caller's transaction: the one that removes (or re-registers)
/// the worker. `Released` (an unregister) queues them again as a release
/// does; `Lost` (a death) fails them with `worker_lost`, which spends an
/// attempt (attempts count accepts). Returns how many jobs it moved now; a
/// worker with more running jobs than one transaction may move leaves the
/// rest to the sweeper (see [`ops::requeue_worker_jobs`]).
pub async fn requeue_worker_jobs(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    worker: &[u8],
    departure: Departure,
) -> Result<usize, StoreError> {
    ops::requeue_worker_jobs(tx, ks, worker_type, worker, departure).await
}
