//! Background services of a node, on the tokio runtime: the heartbeat
//! service (and the events it finds for a registration's owner), the
//! reaper, membership watchers and the activity observer (running jobs'
//! activity timeouts). Each task holds a cancellation token
//! (its own, a child of the node's) and stops when its owner goes.

pub mod activity;
pub mod heartbeat;
pub mod leadership;
pub mod membership;
pub mod owner_events;
pub mod reaper;

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

/// Live counts of background tasks, for leak tests and `stats/0`.
#[derive(Debug, Default)]
pub struct TaskCounts {
    /// Registrations the heartbeat service renews.
    pub heartbeats: Arc<AtomicUsize>,
    pub watchers: Arc<AtomicUsize>,
    pub reapers: Arc<AtomicUsize>,
}

/// Wall clock seconds, for the informational `TStamp` of health records.
pub(crate) fn wall_clock_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
