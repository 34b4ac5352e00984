//! How long the retry loop waits before the next attempt.
//!
//! FoundationDB's client backs off a failed transaction before its retry
//! (`Transaction::onError` in NativeAPI.actor.cpp, client knobs
//! `DEFAULT_BACKOFF` 10 ms, `BACKOFF_GROWTH_RATE` 2, `DEFAULT_MAX_BACKOFF`
//! 1 s) with full jitter: a uniform draw below the current step. That is
//! what keeps retries of throttled transactions (1037 `process_behind`,
//! 1042 `proxy_memory_limit_exceeded`, 1051 `batch_transaction_throttled`,
//! 1213 `tag_throttled`) from hammering a cluster that asked for less load.
//! [`BackoffPolicy::FDB`] is that schedule; the `sim` store uses it too,
//! since it stands for FoundationDB.
//!
//! The embedded store's retryable errors (SQLite busy/locked, a lost lock
//! upgrade) clear in well under a millisecond, so it keeps a shorter
//! schedule, [`BackoffPolicy::LOCAL`].

use std::time::Duration;

use rand::Rng;

/// An exponential schedule with full jitter: before retry `n` (1-based)
/// the loop sleeps a uniform draw in `[0, min(initial · 2^(n-1), max)]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffPolicy {
    /// The ceiling before the first retry.
    pub initial: Duration,
    /// The ceiling never grows past this.
    pub max: Duration,
}

impl BackoffPolicy {
    /// FoundationDB's defaults: 10 ms, doubling, capped at 1 s.
    pub const FDB: BackoffPolicy = BackoffPolicy { initial: Duration::from_millis(10), max: Duration::from_secs(1) };

    /// The embedded store: 1 ms, doubling, capped at 100 ms.
    pub const LOCAL: BackoffPolicy =
        BackoffPolicy { initial: Duration::from_millis(1), max: Duration::from_millis(100) };

    /// The upper bound of the sleep before retry `retry` (1-based; 0 is
    /// treated as 1).
    pub fn ceiling(&self, retry: u32) -> Duration {
        // 2^20 × 1 ms already exceeds any sane cap: no overflow past it.
        let doublings = retry.saturating_sub(1).min(20);
        self.initial.saturating_mul(1u32 << doublings).min(self.max)
    }

    /// A jittered sleep before retry `retry`, drawn from `rng`.
    pub fn delay_with(&self, retry: u32, rng: &mut impl Rng) -> Duration {
        let ceiling = self.ceiling(retry).as_micros() as u64;
        Duration::from_micros(rng.random_range(0..=ceiling))
    }

    /// [`Self::delay_with`] on the thread's random generator.
    pub fn delay(&self, retry: u32) -> Duration {
        self.delay_with(retry, &mut rand::rng())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn fdb_schedule_starts_at_10ms_doubles_and_caps_at_1s() {
        let ms: Vec<u128> = (1..=10).map(|n| BackoffPolicy::FDB.ceiling(n).as_millis()).collect();
        assert_eq!(ms, vec![10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
        assert_eq!(BackoffPolicy::FDB.ceiling(0), Duration::from_millis(10));
        assert_eq!(BackoffPolicy::FDB.ceiling(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn local_schedule_stays_short() {
        let ms: Vec<u128> = (1..=9).map(|n| BackoffPolicy::LOCAL.ceiling(n).as_millis()).collect();
        assert_eq!(ms, vec![1, 2, 4, 8, 16, 32, 64, 100, 100]);
    }

    #[test]
    fn delays_are_jittered_within_the_ceiling() {
        let mut rng = StdRng::seed_from_u64(14);
        for retry in 1..=12 {
            let ceiling = BackoffPolicy::FDB.ceiling(retry);
            let draws: Vec<Duration> = (0..200).map(|_| BackoffPolicy::FDB.delay_with(retry, &mut rng)).collect();
            assert!(draws.iter().all(|d| *d <= ceiling), "retry {retry}: a draw above {ceiling:?}");
            // Full jitter: draws spread over the whole range, not one value.
            let low = draws.iter().filter(|d| **d < ceiling / 2).count();
            assert!((40..=160).contains(&low), "retry {retry}: {low} of 200 draws below half the ceiling");
        }
    }
}
