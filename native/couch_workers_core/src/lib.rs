//! couch_workers core: background jobs and worker membership for CouchDB
//! nodes that share one store (FoundationDB, or the embedded store on one
//! host). Knows nothing of Erlang: the NIF crate converts terms and sends
//! messages; everything else lives here.
//!
//! | module | job |
//! | --- | --- |
//! | `store` | the store abstraction (FoundationDB's transaction model) and its stores: `embedded`, `fdb`, `sim` |
//! | `keyspace` | the key space, packed with the tuple layer (`docs/keyspace.md`) |
//! | `workers` | worker records: register, heartbeat, remove, reap, membership reads |
//! | `liveness` | the liveness rule: what a reaper must have seen before it calls a worker dead |
//! | `jobs` | the job queue: records, indexes, accept, the dispatcher and sweepers |
//! | `services` | a node's background tasks: heartbeats, reapers, membership watchers, owner events |
//! | `node` | [`Node`]: one open store and the services of one Erlang VM; [`Registration`] |
//! | `inspect` | operations' read side (worker types, workers, job pages) |
//! | `metrics` | counters of the store's retry loop |
//! | `log` | structured log events handed to a sink (the NIF forwards them to `logger`) |
//! | `error` | [`Error`]: the outcomes a call can have besides success |
//! | `conformance`, `conformance_keyspace` | the test suites every store runs (feature `testkit`, for tests only) |

pub mod error;
pub mod inspect;
pub mod jobs;
pub mod keyspace;
pub mod liveness;
pub mod log;
pub mod metrics;
pub mod node;
pub mod services;
pub mod store;
pub mod workers;

#[cfg(feature = "testkit")]
pub mod conformance;
#[cfg(feature = "testkit")]
pub mod conformance_keyspace;

pub use error::Error;
pub use node::{MembershipWatch, Node, Registration, Settings, Stats};
