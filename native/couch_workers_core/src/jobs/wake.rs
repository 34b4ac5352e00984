//! The promoter's and the pruner's wait: until a deadline (the earliest
//! moment they know of work) or a change of the key they watch, whichever
//! comes first, so that an idle node wakes them on change, not on a timer.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::store::Watch;
use crate::tasks::jittered;
use crate::tasks::watch_limit::{is_too_many_watches, WatchLimit};

/// How soon to look again when there is no working watch (it could not
/// be armed, or it failed): the cadence of the timers before watches.
pub(crate) const UNWATCHED: Duration = Duration::from_millis(1000);

/// Why a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woke {
    /// The deadline passed, or the watch could not be relied on.
    Timer,
    /// The watched key changed (or the store says it may have).
    Changed,
    Cancelled,
}

/// One service's sleeps, each cut short by a watched key's change, with
/// its run of watches refused at the handle's limit
/// (`tasks/watch_limit.rs`).
pub(crate) struct WatchedSleep<'a> {
    limit: &'a WatchLimit,
    at_limit: u32,
}

impl<'a> WatchedSleep<'a> {
    pub fn new(limit: &'a WatchLimit) -> Self {
        WatchedSleep { limit, at_limit: 0 }
    }

    /// Sleeps up to `deadline`, or until `watch` fires. Without a watch,
    /// or with one that fails, it sleeps no longer than [`UNWATCHED`]
    /// (jittered), or the limit's backoff when the handle has too many
    /// watches.
    pub async fn sleep(&mut self, deadline: Duration, watch: Option<Watch>, cancel: &CancellationToken) -> Woke {
        let until = Instant::now() + deadline;
        let fired = match watch {
            None => Err(None),
            Some(watch) => tokio::select! {
                _ = cancel.cancelled() => return Woke::Cancelled,
                _ = tokio::time::sleep_until(until) => return Woke::Timer,
                fired = watch => fired.map_err(Some),
            },
        };
        let pause = match fired {
            Ok(()) => {
                if self.at_limit > 0 {
                    self.at_limit = 0;
                    self.limit.cleared();
                }
                return Woke::Changed;
            }
            Err(Some(e)) if is_too_many_watches(&e) => {
                self.at_limit += 1;
                self.limit.reached(self.at_limit)
            }
            Err(_) => jittered(UNWATCHED, 0.2),
        };
        let at = until.min(Instant::now() + pause);
        tokio::select! {
            _ = cancel.cancelled() => Woke::Cancelled,
            _ = tokio::time::sleep_until(at) => Woke::Timer,
        }
    }
}
