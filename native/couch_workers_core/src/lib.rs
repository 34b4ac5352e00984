//! couch_workers core: background jobs and worker membership for CouchDB
//! nodes that share one store (FoundationDB, or the embedded store on one
//! host). Knows nothing of Erlang: the NIF crate converts terms and sends
//! messages; everything else lives here.
//!
//! ## Map, in dependency order
//!
//! Each module uses only those above it, never one beside it in the same
//! row: the layers are the list in `scripts/check-layers.py`, which the
//! test command runs (it fails on an import upward or in a circle).
//!
//! | module | job |
//! | --- | --- |
//! | `stage`, `metrics` | stage stamps for the bench's per-stage split of M2 and J3x (feature `stage-trace`; empty otherwise); counters of the store's retry loop and of supervised restarts (plain atomics) |
//! | `log` | events and spans through `tracing`; the one layer that hands each event to its node's sink (the NIF's sends it to `logger`), and the one that adds the transaction span's tally to `metrics` |
//! | `store` | the store abstraction (FoundationDB's transaction model), the one retry loop (`store::retry`), the retry-safe write (`store::receipt`: a write's receipt, so that a retry after `commit_unknown_result` answers for it; `keyspace` packs its keys, through the `ReceiptKeys` it implements) and the stores: `embedded`, `fdb`, `sim`; the test wrappers `faulty` (random faults) and `hooked` (a forwarding transaction with a test's hooks), feature `testkit` |
//! | `error`, `keyspace` | [`Error`]: the outcomes a call can have besides success; the key space, packed with the tuple layer: every key's bytes are built here (`docs/keyspace.md` describes them) |
//! | `tasks` | what every long-lived task uses: its live count, jittered and cancellable sleeps, supervision, the watch-limit episode |
//! | `context` | [`Context`]: one node's store handle, key space, logger, transaction options, cancellation and (supervised) spawning, shared by every service and call; alone it runs nothing |
//! | `workers`, `jobs`, `inspect` | side by side: worker records (the worker keys' writes, membership reads); the job queue: records, indexes, `ops` (every job write), [`Jobs`] (the stateless job API on a context), `JobService` (the node's: `Jobs` plus accept, subscribe and the daemons), the accept dispatcher, subscriptions, sweeper, pruner, promoter; operations' read side (worker types, workers, a type's pause flag), as calls on a [`Context`] |
//! | `liveness`, `roster`, `leadership` | the liveness rule: what a reaper must have seen before it calls a worker dead (uses one limit of `workers`); the registration writes that can end one (register, heartbeat, remove, reap) with the requeue of its running jobs in the same transaction; a worker type's leader (its oldest registration) and the writes fenced by it (`if_leader`) |
//! | `schedules` | recurring jobs: a schedule's spec (every, cron) and record, its slots fired once each by any node (the slot's job created in the transaction that moves the schedule on), the node's runner that sleeps until the earliest slot |
//! | `services` | a node's background services: the heartbeat service, reapers, membership watchers, owner events |
//! | `node` | [`Node`]: a context and the daemons of one Erlang VM (the only starter of daemons); [`Registration`] |
//! | `conformance`, `test_store` | the store conformance suite every store runs; the store a test runs on (embedded, sim, a live FoundationDB) and `store_tests!`, one test body per store (feature `testkit`, for tests only) |
//! | `conformance_keyspace` | the key-space conformance suite every store runs (feature `testkit`) |
//!
//! ## Where things happen
//!
//! * A key is packed in `keyspace/` and nowhere else (the tuple layer;
//!   `docs/keyspace.md`); a job's stored value in `jobs/record/`, a
//!   worker's in `workers.rs`.
//! * A heartbeat is written by `roster::heartbeat_many` (the health
//!   record through `workers`, and `health_vs`), in the transaction that
//!   `services/heartbeat.rs` (`HeartbeatService::renew`) runs for a chunk
//!   of the node's registrations; the reaper (`services/reaper.rs`) reads
//!   them and decides by the rule of `liveness/`.
//! * A job change reaches a subscriber as: a write in `jobs::ops` changes
//!   the job's record (its `vs`), the store's watch on the record fires in
//!   `jobs::subscription` (one watcher per node and job), which re-reads
//!   the job and calls each subscriber's callback; the NIF's callback
//!   (`couch_workers_nif/src/jobs/subscribe.rs`) sends the message.
//! * A membership change reaches a watcher the same way: a register,
//!   removal or reap moves the type's `membership_vs`
//!   (`workers.rs`), the watch fires in `services/membership.rs`, which
//!   reads the changes and calls the NIF's callback
//!   (`couch_workers_nif/src/membership.rs`).
//!
//! What to change without touching Erlang: everything in this crate (the
//! queue's and membership's rules, stores, services) and its tests;
//! `couch_workers_nif` only when a call's arguments or answers change, and
//! then `src/couch_workers_nif.erl` with it.
//!
//! ## The facade
//!
//! What the NIF and the command line use is re-exported here, and nothing
//! else of the crate is public: the modules are `pub(crate)`. The crate's
//! integration tests (`tests/`) and the benchmark programs
//! (`couch_workers_bench`) need internals (the store API, the key space,
//! `jobs::ops`), so with the `internals` feature (which `testkit` turns on;
//! only they enable either) the same modules are `pub`
//! ([`internal_modules!`] declares each module both ways). A build without
//! it (the NIF's, the command line's) sees the facade alone:
//! `scripts/check-facade.sh` counts its items, and the compiler's
//! dead-code lint sees what no caller uses.

/// Declares each module `pub` with the `internals` feature (the crate's
/// own tests, the benchmarks) and `pub(crate)` without it.
macro_rules! internal_modules {
    ($($(#[$attr:meta])* $name:ident;)*) => {
        $(
            $(#[$attr])*
            #[cfg(feature = "internals")]
            pub mod $name;
            $(#[$attr])*
            #[cfg(not(feature = "internals"))]
            pub(crate) mod $name;
        )*
    };
}

internal_modules! {
    context;
    error;
    inspect;
    jobs;
    keyspace;
    leadership;
    liveness;
    metrics;
    node;
    roster;
    schedules;
    services;
    stage;
    store;
    tasks;
    workers;
}

// By hand: a `macro_export`ed macro (`log_event!`) must not come from a
// macro-expanded module.
#[cfg(feature = "internals")]
pub mod log;
#[cfg(not(feature = "internals"))]
pub(crate) mod log;

#[cfg(feature = "testkit")]
pub mod conformance;
#[cfg(feature = "testkit")]
pub mod conformance_keyspace;
#[cfg(feature = "testkit")]
pub mod test_store;

// ---- the facade -------------------------------------------------------

// A node and its workers.
pub use keyspace::Incarnation;
pub use node::{MembershipWatch, Node, Registration, Settings, Stats};
pub use services::membership::{MemberChange, MembershipUpdate, OnMembershipUpdate};
pub use services::owner_events::{OnOwnerEvent, OwnerEvent};
pub use workers::WorkerSpec;
// The context and its stateless calls.
pub use context::Context;
pub use inspect::WorkerInfo;
pub use jobs::Jobs;
// Jobs.
pub use jobs::{
    AcceptReply, AcceptToken, AddManyError, Fence, GoneSignal, Job, JobEvent, JobHandle, JobOpts, JobService, JobSpec,
    JobState, JobStats, JobSubscription, JobVs, Keep, MaxAttempts, NextFor, OnJobEvent, Retry, Schedule,
};
/// Job calls inside a caller's transaction (`jobs/in_tx.rs`): the calls,
/// the requests they make of the caller, and their answers.
pub mod caller_tx {
    pub use crate::jobs::TxJobs;
    pub use crate::store::forward::{channel, fdb_code_error, Answer, Answers, Request, Sent};
    pub use crate::store::overlay::Session;
}
/// Leadership of a worker type (`leadership.rs`), fenced writes, and the
/// events its owner is told (`services/leadership.rs`).
pub mod leaders {
    pub use crate::leadership::Leadership;
    pub use crate::services::leadership::LeaderEvent;
}
/// Recurring jobs (`schedules/`).
pub mod recurring {
    pub use crate::schedules::{ScheduleEntry, Schedules};
}
// Outcomes, the store's configuration and limits.
pub use error::Error;
pub use store::{StoreConfig, MAX_TRANSACTION_SIZE, MAX_VALUE_SIZE};
// Events (`log_event!`) and counters.
pub use log::{set_process_sink, Event, Level, Logger, Sink, Value};
// The layers a host that installs its own `tracing` subscriber stacks:
// without them no sink sees an event and the store's counters stay still.
pub use log::{count, forward, Count, Forward};
pub use metrics::{SERVICES, STORE};
// What shapes how a type's jobs run, beyond the queue's order: the
// type's settings (`job_type_get/1`, `job_type_set/2`), a job's own
// activity timeout, a job's run history (`job_get/2`). One module, so
// that the facade grows by one name.
pub mod job_controls {
    pub use crate::jobs::history::{Outcome, Run};
    pub use crate::jobs::{ActivityTimeout, TypeSetting, TypeSettings};
}
pub use stage::mark as stage_mark;
// What `log_event!` expands to.
#[doc(hidden)]
pub use log::__tracing;
