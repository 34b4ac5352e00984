//! couch_workers core: background jobs and worker membership for CouchDB
//! nodes that share one store (FoundationDB, or the embedded store on one
//! host). Knows nothing of Erlang: the NIF crate converts terms and sends
//! messages; everything else lives here.
//!
//! ## Map, in dependency order
//!
//! Each module uses only those above it, except where noted.
//!
//! | module | job |
//! | --- | --- |
//! | `log` | events and spans through `tracing`; the one layer that hands each event to its node's sink (the NIF's sends it to `logger`) |
//! | `metrics` | counters of the store's retry loop |
//! | `store` | the store abstraction (FoundationDB's transaction model) and its stores: `embedded`, `fdb`, `sim`; the test wrappers `faulty` (random faults) and `hooked` (a forwarding transaction with a test's hooks), feature `testkit` |
//! | `error` | [`Error`]: the outcomes a call can have besides success |
//! | `keyspace` | the key space, packed with the tuple layer: every key's bytes are built here (`docs/keyspace.md`) |
//! | `liveness` | the liveness rule: what a reaper must have seen before it calls a worker dead (uses one limit of `workers`) |
//! | `workers` | worker records: register, heartbeat (the health record is written in `workers::heartbeat`/`heartbeat_many`), remove, reap, membership reads; a removal requeues the worker's jobs through `jobs` in its own transaction |
//! | `services` | a node's background tasks: the heartbeat service, reapers, membership watchers, owner events |
//! | `jobs` | the job queue: records, indexes, `ops` (every job write), the accept dispatcher, subscriptions, sweeper, pruner (uses small helpers of `services`) |
//! | `inspect` | operations' read side (worker types, workers, job pages) |
//! | `node` | [`Node`]: one open store and the services of one Erlang VM; [`Registration`] |
//! | `stage` | stage stamps for the bench's per-stage split of M2 and J3x (feature `stage-trace`; empty otherwise) |
//! | `conformance`, `conformance_keyspace` | the test suites every store runs (feature `testkit`, for tests only) |
//! | `test_store` | the store a test runs on (embedded, sim, a live FoundationDB) and `store_tests!`, one test body per store (feature `testkit`) |
//!
//! A job change reaches a subscriber as: a write in `jobs::ops` changes the
//! job's record (its `vs`), the store's watch on the record fires in
//! `jobs::subscription` (one watcher per node and job), which re-reads the
//! job and calls each subscriber's callback; the NIF's callback
//! (`couch_workers_nif/src/jobs/subscribe.rs`) sends the message.

pub mod context;
pub mod error;
pub mod inspect;
pub mod jobs;
pub mod keyspace;
pub mod liveness;
pub mod log;
pub mod metrics;
pub mod node;
pub mod services;
pub mod stage;
pub mod store;
pub mod workers;

#[cfg(feature = "testkit")]
pub mod conformance;
#[cfg(feature = "testkit")]
pub mod conformance_keyspace;
#[cfg(feature = "testkit")]
pub mod test_store;

pub use context::Context;
pub use error::Error;
pub use inspect::WorkerInfo;
pub use jobs::{Job, JobOpts, JobState, Jobs};
pub use node::{MembershipWatch, Node, Registration, Settings, Stats};
pub use store::StoreConfig;
