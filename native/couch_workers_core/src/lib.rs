//! couch_workers core: background jobs and worker membership for CouchDB
//! nodes that share one store (FoundationDB, or the embedded store on one
//! host). Knows nothing of Erlang: the NIF crate converts terms and sends
//! messages; everything else lives here.
//!
//! ## Map, in dependency order
//!
//! Each module uses only those above it, never one beside it in the same
//! row group: the layers are the list in `scripts/check-layers.py`, which
//! the test command runs (it fails on an import upward or in a circle).
//!
//! | module | job |
//! | --- | --- |
//! | `stage`, `metrics` | stage stamps for the bench's per-stage split of M2 and J3x (feature `stage-trace`; empty otherwise); counters of the store's retry loop and of supervised restarts (plain atomics) |
//! | `log` | events and spans through `tracing`; the one layer that hands each event to its node's sink (the NIF's sends it to `logger`), and the one that adds the transaction span's tally to `metrics` |
//! | `store` | the store abstraction (FoundationDB's transaction model) and its stores: `embedded`, `fdb`, `sim`; the test wrappers `faulty` (random faults) and `hooked` (a forwarding transaction with a test's hooks), feature `testkit` |
//! | `error`, `keyspace` | [`Error`]: the outcomes a call can have besides success; the key space, packed with the tuple layer: every key's bytes are built here (`docs/keyspace.md` describes them) |
//! | `tasks` | what every long-lived task uses: its live count, jittered and cancellable sleeps, supervision, the watch-limit episode |
//! | `workers`, `jobs` | side by side: worker records (the worker keys' writes, membership reads); the job queue: records, indexes, `ops` (every job write), the accept dispatcher, subscriptions, sweeper, pruner |
//! | `liveness`, `roster` | the liveness rule: what a reaper must have seen before it calls a worker dead (uses one limit of `workers`); the registration writes that can end one (register, heartbeat, remove, reap) with the requeue of its running jobs in the same transaction |
//! | `services` | a node's background services: the heartbeat service, reapers, membership watchers, owner events |
//! | `node` | [`Node`]: one open store and the services of one Erlang VM; [`Registration`] |
//! | `inspect` | operations' read side (worker types, workers, job pages), as methods of [`Node`] |
//! | `conformance`, `test_store` | the store conformance suite every store runs; the store a test runs on (embedded, sim, a live FoundationDB) and `store_tests!`, one test body per store (feature `testkit`, for tests only) |
//! | `conformance_keyspace` | the key-space conformance suite every store runs (feature `testkit`) |
//!
//! A job change reaches a subscriber as: a write in `jobs::ops` changes the
//! job's record (its `vs`), the store's watch on the record fires in
//! `jobs::subscription` (one watcher per node and job), which re-reads the
//! job and calls each subscriber's callback; the NIF's callback
//! (`couch_workers_nif/src/jobs/subscribe.rs`) sends the message.

pub mod error;
pub mod inspect;
pub mod jobs;
pub mod keyspace;
pub mod liveness;
pub mod log;
pub mod metrics;
pub mod node;
pub mod roster;
pub mod services;
pub mod stage;
pub mod store;
pub mod tasks;
pub mod workers;

#[cfg(feature = "testkit")]
pub mod conformance;
#[cfg(feature = "testkit")]
pub mod conformance_keyspace;
#[cfg(feature = "testkit")]
pub mod test_store;

pub use error::Error;
pub use node::{MembershipWatch, Node, Registration, Settings, Stats};
