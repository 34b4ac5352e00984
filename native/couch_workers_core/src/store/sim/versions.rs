//! The version clock of a simulated cluster, as FoundationDB's master
//! hands out commit versions.
//!
//! * A commit version is the previous one plus the time since the previous
//!   commit batch at [`VERSIONS_PER_SECOND`], at least 1 and at most
//!   [`MAX_READ_TRANSACTION_LIFE_VERSIONS`] (the master's `getVersion`).
//! * Read versions are the last committed version: they stand still while
//!   nothing commits, except that an idle cluster's proxies commit an empty
//!   batch every [`EMPTY_BATCH_INTERVAL`] (`MAX_COMMIT_BATCH_INTERVAL`),
//!   which the clock makes lazily, when it is next asked.
//! * A recovery moves the version by [`RECOVERY_VERSION_JUMP`]
//!   (`MAX_VERSIONS_IN_FLIGHT`, 100 s' worth).
//!
//! Time is tokio's clock, so a test on a paused runtime runs the
//! simulated seconds at once.

use std::time::Duration;

use tokio::time::Instant;

use crate::store::{MAX_READ_TRANSACTION_LIFE_VERSIONS, MAX_VERSIONS_IN_FLIGHT, VERSIONS_PER_SECOND};

/// How far versions jump at a simulated recovery: FoundationDB's
/// `MAX_VERSIONS_IN_FLIGHT`.
pub const RECOVERY_VERSION_JUMP: u64 = MAX_VERSIONS_IN_FLIGHT;
/// `MAX_COMMIT_BATCH_INTERVAL`: an idle cluster commits an empty batch
/// this often.
pub const EMPTY_BATCH_INTERVAL: Duration = Duration::from_secs(2);

/// The versions of one simulated cluster.
#[derive(Debug)]
pub(super) struct VersionClock {
    /// The last committed version (of a real or an empty batch).
    committed: u64,
    /// When that batch committed.
    last_batch_at: Instant,
    /// Empty batches made so far (for the tests and stats).
    empty_batches: u64,
}

/// Versions for `elapsed` at the cluster's rate, within the master's bounds.
fn step(elapsed: Duration) -> u64 {
    let versions = elapsed.as_micros().saturating_mul(u128::from(VERSIONS_PER_SECOND)) / 1_000_000;
    u64::try_from(versions).unwrap_or(u64::MAX).clamp(1, MAX_READ_TRANSACTION_LIFE_VERSIONS)
}

impl VersionClock {
    pub(super) fn new(start: u64, now: Instant) -> Self {
        VersionClock { committed: start, last_batch_at: now, empty_batches: 0 }
    }

    /// Makes the empty batches an idle cluster would have committed by `now`.
    fn catch_up(&mut self, now: Instant) {
        while now.saturating_duration_since(self.last_batch_at) >= EMPTY_BATCH_INTERVAL {
            self.last_batch_at += EMPTY_BATCH_INTERVAL;
            self.committed += step(EMPTY_BATCH_INTERVAL);
            self.empty_batches += 1;
        }
    }

    /// The version a read version request gets at `now`.
    pub(super) fn read_version(&mut self, now: Instant) -> u64 {
        self.catch_up(now);
        self.committed
    }

    /// The version of a commit batch made at `now`.
    pub(super) fn next_commit_version(&mut self, now: Instant) -> u64 {
        self.catch_up(now);
        self.committed += step(now.saturating_duration_since(self.last_batch_at));
        self.last_batch_at = now;
        self.committed
    }

    /// A recovery: versions move on by [`RECOVERY_VERSION_JUMP`].
    pub(super) fn recover(&mut self, now: Instant) {
        self.catch_up(now);
        self.committed += RECOVERY_VERSION_JUMP;
        self.last_batch_at = now;
    }

    pub(super) fn empty_batches(&self) -> u64 {
        self.empty_batches
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_versions_stand_still_between_commits_and_empty_batches() {
        let t0 = Instant::now();
        let mut clock = VersionClock::new(1_000, t0);
        assert_eq!(clock.read_version(t0 + Duration::from_millis(1_999)), 1_000);
        assert_eq!(clock.read_version(t0 + Duration::from_millis(2_000)), 1_000 + 2_000_000);
        assert_eq!(clock.read_version(t0 + Duration::from_millis(5_000)), 1_000 + 4_000_000);
        assert_eq!(clock.empty_batches(), 2);
    }

    #[test]
    fn commit_versions_follow_time_within_the_masters_bounds() {
        let t0 = Instant::now();
        let mut clock = VersionClock::new(0, t0);
        assert_eq!(clock.next_commit_version(t0 + Duration::from_millis(100)), 100_000);
        // Two commits at one instant still get distinct versions.
        assert_eq!(clock.next_commit_version(t0 + Duration::from_millis(100)), 100_001);
        // The empty batch at +2.1 s comes first, then 0.5 s more.
        assert_eq!(clock.next_commit_version(t0 + Duration::from_millis(2_600)), 100_001 + 2_000_000 + 500_000);
        clock.recover(t0 + Duration::from_millis(2_600));
        assert_eq!(clock.read_version(t0 + Duration::from_millis(2_600)), 2_600_001 + RECOVERY_VERSION_JUMP);
    }
}
