//! What every long-lived task of a node uses, the job queue's and the
//! services' alike: its live count ([`Live`]), jittered and cancellable
//! sleeps, supervision (`supervise.rs`: restarts after a panic, with
//! backoff), and the watch-limit episode (`watch_limit.rs`: the backoff of
//! a watcher whose store refused a watch at the handle's limit).

pub mod supervise;
pub mod watch_limit;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio_util::sync::CancellationToken;

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
