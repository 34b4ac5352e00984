//! couch_workers core: background jobs and worker membership for CouchDB
//! nodes that share one store (FoundationDB, or the embedded store on one
//! host). Knows nothing of Erlang: the NIF crate converts terms and sends
//! messages; everything else lives here.

pub mod store;
pub mod keyspace;
#[cfg(feature = "testkit")]
pub mod conformance;
#[cfg(feature = "testkit")]
pub mod conformance_keyspace;
pub mod error;
pub mod inspect;
pub mod jobs;
pub mod liveness;
pub mod log;
pub mod metrics;
pub mod workers;

pub use error::Error;
pub mod node;
pub mod services;

pub use node::{MembershipWatch, Node, Registration, Settings, Stats};
