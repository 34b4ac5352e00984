//! Background services of a node, on the tokio runtime: the heartbeat
//! service (and the events it finds for a registration's owner), the
//! reaper and membership watchers. Each task holds a cancellation token
//! (its own, a child of the node's) and stops when its owner goes.

pub mod heartbeat;
pub mod membership;
pub mod owner_events;
pub mod reaper;
pub mod supervise;
pub mod watch_limit;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio_util::sync::CancellationToken;

/// Live counts of background tasks, for leak tests and `stats/0`.
#[derive(Debug, Default)]
pub struct TaskCounts {
    /// Registrations the heartbeat service renews.
    pub heartbeats: Arc<AtomicUsize>,
    pub watchers: Arc<AtomicUsize>,
    pub reapers: Arc<AtomicUsize>,
}

/// Counts a task live for as long as it exists, whichever way it ends.
/// Taken by the spawner and moved into the task, so that the task counts
/// from the moment it is spawned, not from its first poll.
pub struct Live(Arc<AtomicUsize>);

impl Live {
    pub fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Live(count.clone())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `base` scaled by a random factor in `[1 - spread, 1 + spread]`, so that
/// periodic tasks of many nodes do not fall into step.
pub(crate) fn jittered(base: Duration, spread: f64) -> Duration {
    let factor = rand::rng().random_range((1.0 - spread)..=(1.0 + spread));
    base.mul_f64(factor.max(0.0))
}

/// Sleeps for `d` unless `cancel` fires first; returns false if canceled.
pub(crate) async fn sleep_or_cancel(d: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

/// Wall clock seconds, for the informational `TStamp` of health records.
pub(crate) fn wall_clock_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
