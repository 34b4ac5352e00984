//! The liveness rule, on the store's clock only.
//!
//! A heartbeat's health record carries the versionstamp of the commit that
//! wrote it; its first 8 bytes are that commit's version. Store versions
//! advance at about one million per second (FoundationDB's rate, which the
//! embedded store copies), so a worker is dead when the store's current
//! read version is more than `timeout` seconds' worth of versions past its
//! last heartbeat. No node's wall clock takes part: two nodes whose clocks
//! disagree by an hour still agree on who is dead.

use crate::keyspace::Health;

/// Store versions per second (FoundationDB's `VERSIONS_PER_SECOND`).
pub const VERSIONS_PER_SECOND: u64 = 1_000_000;

/// The versions that `timeout_s` seconds span (a negative timeout, which
/// only a corrupt record can hold, counts as zero).
pub fn timeout_versions(timeout_s: i64) -> u64 {
    u64::try_from(timeout_s).unwrap_or(0).saturating_mul(VERSIONS_PER_SECOND)
}

/// Whether the worker whose last heartbeat is `health` is dead at
/// `read_version`.
pub fn is_dead(health: &Health, read_version: u64) -> bool {
    read_version > health.version().saturating_add(timeout_versions(health.timeout_s))
}

/// Versions left before the worker is dead at `read_version` (0 if it is).
pub fn versions_until_dead(health: &Health, read_version: u64) -> u64 {
    health.version().saturating_add(timeout_versions(health.timeout_s)).saturating_sub(read_version)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(version: u64, timeout_s: i64) -> Health {
        let mut versionstamp = [0u8; 10];
        versionstamp[..8].copy_from_slice(&version.to_be_bytes());
        Health { versionstamp, tstamp: 0, timeout_s, incarnation: None }
    }

    #[test]
    fn alive_within_timeout() {
        let h = health(10_000_000, 15);
        assert!(!is_dead(&h, 10_000_000));
        assert!(!is_dead(&h, 25_000_000), "exactly at the timeout is still alive");
        assert_eq!(versions_until_dead(&h, 20_000_000), 5_000_000);
    }

    #[test]
    fn dead_past_timeout() {
        let h = health(10_000_000, 15);
        assert!(is_dead(&h, 25_000_001));
        assert_eq!(versions_until_dead(&h, 30_000_000), 0);
    }

    #[test]
    fn read_version_before_heartbeat_is_alive() {
        // A reader whose version predates the heartbeat never reaps it.
        let h = health(10_000_000, 1);
        assert!(!is_dead(&h, 5));
    }

    #[test]
    fn absurd_records_do_not_overflow() {
        assert!(!is_dead(&health(u64::MAX - 1, i64::MAX), u64::MAX));
        assert!(is_dead(&health(0, -5), 1), "a negative timeout counts as zero");
    }

    #[test]
    fn wall_clock_plays_no_part() {
        let mut a = health(10_000_000, 3);
        let mut b = a;
        a.tstamp = 0;
        b.tstamp = 4_000_000_000;
        assert_eq!(is_dead(&a, 13_500_000), is_dead(&b, 13_500_000));
    }
}
