//! The embedded store's version clock, shared by every process on the host.
//!
//! FoundationDB's versions rise at about one million per second; the key
//! space measures liveness on them. Here a version is a count of
//! microseconds: `base + CLOCK_MONOTONIC`, where `base` lives in the store's
//! `meta` table. CLOCK_MONOTONIC is one clock for every process of one
//! boot and never jumps (unlike the wall clock; NTP only slews its rate), so
//! every process that reads the same `base` shares one clock.
//!
//! `base` is reset by the first opener after a reboot (the stored boot id
//! differs from the current one, see [`boot_id`]): it becomes
//! `max(last_version + 1, wall clock µs) − monotonic µs`, so the clock starts
//! above every version ever committed and, on a new store, near the wall
//! clock (for humans reading versions; nothing compares them with a wall
//! clock). Commit versions are additionally forced above the last one, so
//! they strictly increase even if the clock misbehaves.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds on CLOCK_MONOTONIC: one clock for every process of a boot.
/// `std::time::Instant` reads the same clock but cannot be compared across
/// processes, hence libc.
pub(crate) fn monotonic_us() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC exists on
    // every platform this crate builds for.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        // Cannot happen with a valid clock id; stay panic-free regardless.
        // Commit versions stay strictly increasing (they are forced above
        // the last one), only their pace would be off.
        return 0;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000).saturating_add(nanos / 1_000)
}

/// Microseconds since the Unix epoch on the wall clock (0 if it is set
/// before 1970). Only used to start a new boot's clock near real time.
pub(crate) fn wall_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)).unwrap_or(0)
}

/// An identifier of the current boot of the host: Linux's
/// `/proc/sys/kernel/random/boot_id` (the same for every process and
/// container on one kernel). Elsewhere, an estimate of the boot time in
/// whole minutes (wall clock minus monotonic clock), which is the same for
/// every process unless the wall clock is stepped by a minute or more; a
/// wrong guess only makes the next opener restart the clock above the last
/// version, which keeps versions increasing.
pub(crate) fn boot_id() -> String {
    match std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        Ok(id) if !id.trim().is_empty() => id.trim().to_string(),
        _ => {
            let boot_s = wall_us().saturating_sub(monotonic_us()) / 1_000_000;
            format!("estimated-boot-minute-{}", boot_s / 60)
        }
    }
}

/// The clock of one store: `base + CLOCK_MONOTONIC`, in microseconds.
/// `base` is atomic only so that [`Clock::jump`] can move it.
#[derive(Debug)]
pub(crate) struct Clock {
    base: AtomicI64,
}

impl Clock {
    pub(crate) fn new(base: i64) -> Self {
        Clock { base: AtomicI64::new(base) }
    }

    /// Moves this clock forward by `us` microseconds, as a FoundationDB
    /// recovery moves versions forward (fault tests only). Versions keep
    /// rising at their rate from there; they never go back.
    #[cfg(any(test, feature = "internals"))]
    pub(crate) fn jump(&self, us: u64) {
        let us = i64::try_from(us).unwrap_or(i64::MAX);
        let _ = self.base.fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| Some(b.saturating_add(us)));
    }

    /// The base this boot's clock was started with (stored in `meta`).
    pub(crate) fn base_for_new_boot(last_version: u64) -> i64 {
        let start = last_version.saturating_add(1).max(wall_us());
        let start = i64::try_from(start).unwrap_or(i64::MAX);
        let mono = i64::try_from(monotonic_us()).unwrap_or(i64::MAX);
        start.saturating_sub(mono)
    }

    /// The current version on this clock.
    pub(crate) fn now(&self) -> u64 {
        let mono = i64::try_from(monotonic_us()).unwrap_or(i64::MAX);
        u64::try_from(self.base.load(Ordering::Acquire).saturating_add(mono)).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_rises_in_microseconds() {
        let a = monotonic_us();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = monotonic_us();
        assert!(b - a >= 20_000, "{a} -> {b}");
        assert!(b - a < 2_000_000, "{a} -> {b}");
    }

    #[test]
    fn new_boot_starts_above_last_version_and_near_wall_clock() {
        let clock = Clock::new(Clock::base_for_new_boot(0));
        let now = clock.now();
        let wall = wall_us();
        assert!(now.abs_diff(wall) < 1_000_000, "{now} vs {wall}");

        let far = wall + 3_600_000_000;
        let clock = Clock::new(Clock::base_for_new_boot(far));
        assert!(clock.now() > far);
    }

    #[test]
    fn a_jump_moves_the_clock_forward_and_it_keeps_rising() {
        let clock = Clock::new(Clock::base_for_new_boot(0));
        let before = clock.now();
        clock.jump(100_000_000);
        let after = clock.now();
        assert!(after - before >= 100_000_000 && after - before < 101_000_000, "{before} -> {after}");
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert!(clock.now() >= after + 5_000);
    }

    #[test]
    fn boot_id_is_stable() {
        assert_eq!(boot_id(), boot_id());
    }
}
