//! What a watcher does when its watch could not be armed because the
//! database handle has FoundationDB's maximum of outstanding watches
//! (`too_many_watches`, 1032; 10,000 per handle by default).
//!
//! Until watches free up, every watcher of the handle that re-reads at
//! once meets the limit again: re-reading on a fixed short pause turns the
//! node into a poller of every watched key. So a watcher at the limit
//! backs off exponentially (100 ms doubling to 10 s, jittered), and the
//! node logs `watch_limit_reached` once per episode, not once per watcher
//! and failure: the limit is the handle's, so is the episode. The episode
//! ends (`watch_limit_cleared`) when a watcher that had met the limit gets
//! a watch that fires.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::Rng;

use crate::log::Logger;
use crate::log_event;
use crate::store::backoff::BackoffPolicy;
use crate::store::StoreError;

/// FoundationDB's `too_many_watches`.
pub const TOO_MANY_WATCHES: i32 = 1032;

/// The pause before re-reading after the `n`th consecutive failure at the
/// limit: a draw in `[c/2, c]` with `c` from this schedule (never down to
/// zero: thousands of watchers must not all come back at once).
pub const AT_LIMIT: BackoffPolicy = BackoffPolicy { initial: Duration::from_millis(100), max: Duration::from_secs(10) };

/// Whether `err` is FoundationDB's `too_many_watches`.
pub fn is_too_many_watches(err: &StoreError) -> bool {
    matches!(err, StoreError::Fdb { code: TOO_MANY_WATCHES, .. })
}

/// The pause after the `failures`th consecutive failure at the limit.
pub fn delay_at_limit(failures: u32) -> Duration {
    let ceiling = AT_LIMIT.ceiling(failures);
    let us = ceiling.as_micros() as u64;
    Duration::from_micros(rand::rng().random_range(us / 2..=us))
}

/// One node's (one database handle's) watch-limit episode.
pub struct WatchLimit {
    at_limit: AtomicBool,
    log: Logger,
}

impl WatchLimit {
    pub fn new(log: Logger) -> Self {
        WatchLimit { at_limit: AtomicBool::new(false), log }
    }

    /// A watcher's watch failed with `too_many_watches` for the
    /// `failures`th time in a row: logs the episode's start (once) and
    /// answers how long to wait before re-reading.
    pub fn reached(&self, failures: u32) -> Duration {
        if !self.at_limit.swap(true, Ordering::AcqRel) {
            log_event!(
                self.log,
                Warning,
                "watch_limit_reached",
                limit = "too_many_watches (1032)",
                hint = "watchers back off up to 10 s; raise the database option max_watches or watch fewer keys"
            );
        }
        delay_at_limit(failures)
    }

    /// A watcher that had met the limit got a watch that fired: the
    /// handle arms watches again.
    pub fn cleared(&self) {
        if self.at_limit.swap(false, Ordering::AcqRel) {
            log_event!(self.log, Notice, "watch_limit_cleared");
        }
    }

    /// Whether the handle is in an episode (its unit tests).
    #[cfg(test)]
    pub fn is_reached(&self) -> bool {
        self.at_limit.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    struct Collect(Mutex<Vec<&'static str>>);
    impl crate::log::Sink for Collect {
        fn log(&self, event: crate::log::Event) {
            self.0.lock().unwrap().push(event.what);
        }
    }

    #[test]
    fn delays_grow_from_100ms_to_10s_and_never_reach_zero() {
        for n in 1..=12 {
            let c = AT_LIMIT.ceiling(n);
            for _ in 0..50 {
                let d = delay_at_limit(n);
                assert!(d >= c / 2 && d <= c, "failure {n}: {d:?} outside [{:?}, {c:?}]", c / 2);
            }
        }
        assert_eq!(AT_LIMIT.ceiling(1), Duration::from_millis(100));
        assert_eq!(AT_LIMIT.ceiling(8), Duration::from_secs(10));
    }

    #[test]
    fn one_log_line_per_episode() {
        let sink = Arc::new(Collect::default());
        let limit = WatchLimit::new(crate::log::Logger::new(sink.clone()));
        for n in 1..=50 {
            limit.reached(n);
        }
        limit.cleared();
        limit.cleared();
        limit.reached(1);
        assert_eq!(*sink.0.lock().unwrap(), vec!["watch_limit_reached", "watch_limit_cleared", "watch_limit_reached"]);
        assert!(limit.is_reached());
    }

    #[test]
    fn only_1032_is_the_watch_limit() {
        assert!(is_too_many_watches(&StoreError::Fdb { code: 1032, message: String::new(), retryable: false }));
        assert!(!is_too_many_watches(&StoreError::Fdb { code: 1101, message: String::new(), retryable: false }));
        assert!(!is_too_many_watches(&StoreError::Closed));
    }
}
