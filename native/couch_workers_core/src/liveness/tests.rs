//! The liveness rule's cases: jumps, stalls, slow looks, and what a
//! reaper may call dead.

use super::*;
use crate::store::MAX_VERSIONS_IN_FLIGHT;

const SLEEP: Duration = Duration::from_millis(500);

/// A health record as a heartbeat of incarnation `inc` at `version`
/// would store it.
fn health_value(version: u64, tstamp: i64, timeout_s: i64, inc: &[u8; 16]) -> Vec<u8> {
    let mut vs = [0u8; 10];
    vs[..8].copy_from_slice(&version.to_be_bytes());
    let vs = foundationdb_tuple::Versionstamp::complete(vs, 0);
    foundationdb_tuple::pack(&(vs, tstamp, timeout_s, foundationdb_tuple::Bytes::from(&inc[..])))
}

fn record(version: u64, timeout_s: i64) -> Vec<u8> {
    health_value(version, 0, timeout_s, &[7; 16])
}

fn worker(id: &str) -> WorkerId {
    (b"t".to_vec(), id.as_bytes().to_vec())
}

/// A clock for the tests: looks at chosen local times and versions,
/// each taking 1 ms.
struct Clock {
    origin: Instant,
}

impl Clock {
    fn new() -> Self {
        Clock { origin: Instant::now() }
    }

    fn at(&self, ms: u64, read_version: u64) -> Look {
        let started = self.origin + Duration::from_millis(ms);
        Look { read_version, started, finished: started + Duration::from_millis(1) }
    }
}

/// Looks every `step_ms` from `from_ms` to `to_ms`, versions in step
/// with local time (plus `offset`), judging one record each time.
fn watch(
    o: &mut Observer,
    c: &Clock,
    w: &WorkerId,
    rec: &[u8],
    (from_ms, to_ms, step_ms): (u64, u64, u64),
    offset: u64,
) -> Verdict {
    let mut verdict = Verdict::Alive { left: Duration::MAX };
    for ms in (from_ms..=to_ms).step_by(step_ms as usize) {
        let look = c.at(ms, offset + ms * 1000);
        assert_eq!(o.look(look), None, "no restart at {ms} ms");
        verdict = o.judge(w, rec, &look);
        o.end_pass();
    }
    verdict
}

#[test]
fn unchanged_for_the_timeout_in_both_measures_is_dead() {
    let (c, mut o, w) = (Clock::new(), Observer::new(SLEEP), worker("w"));
    let rec = record(1, 1);
    assert_eq!(watch(&mut o, &c, &w, &rec, (0, 900, 100), 0), Verdict::Alive { left: Duration::from_millis(101) });
    assert_eq!(watch(&mut o, &c, &w, &rec, (1000, 1000, 100), 0), Verdict::Alive { left: Duration::from_millis(1) });
    assert_eq!(watch(&mut o, &c, &w, &rec, (1100, 1100, 100), 0), Verdict::Dead);
}

#[test]
fn versions_advanced_but_local_time_not_is_alive() {
    // Versions run at the allowed maximum (twice local time): the
    // version measure passes the 1 s timeout after 0.5 s, the local one
    // has not.
    let (c, mut o, w) = (Clock::new(), Observer::new(SLEEP), worker("w"));
    let rec = record(1, 1);
    for ms in (0..=900).step_by(100) {
        let look = c.at(ms, ms * 2000);
        assert_eq!(o.look(look), None);
        assert!(matches!(o.judge(&w, &rec, &look), Verdict::Alive { .. }), "at {ms} ms");
    }
}

#[test]
fn local_time_passed_but_versions_not_is_alive() {
    // A store whose read versions stand still (FoundationDB read
    // versions that lag) never makes a worker dead on local time alone.
    let (c, mut o, w) = (Clock::new(), Observer::new(SLEEP), worker("w"));
    let rec = record(1, 1);
    for ms in (0..=3000).step_by(100) {
        let look = c.at(ms, 5_000_000);
        assert_eq!(o.look(look), None);
        assert!(matches!(o.judge(&w, &rec, &look), Verdict::Alive { .. }), "at {ms} ms");
    }
}

#[test]
fn a_version_jump_restarts_observation() {
    let (c, mut o, w) = (Clock::new(), Observer::new(SLEEP), worker("w"));
    let rec = record(1, 1);
    watch(&mut o, &c, &w, &rec, (0, 900, 100), 0);
    // FoundationDB's recovery: 100 s of versions within 100 ms.
    let jumped = c.at(1000, 1000 * 1000 + 100 * VERSIONS_PER_SECOND);
    assert_eq!(o.look(jumped), Some(Restart::VersionJump));
    assert_eq!(o.watching(), 0, "everything seen before is forgotten");
    assert_eq!(o.judge(&w, &rec, &jumped), Verdict::Alive { left: Duration::from_secs(1) });
    // A whole timeout must pass again, in both measures, after the jump.
    let offset = 100 * VERSIONS_PER_SECOND;
    assert!(matches!(watch(&mut o, &c, &w, &rec, (1100, 1900, 100), offset), Verdict::Alive { .. }));
    assert_eq!(watch(&mut o, &c, &w, &rec, (2100, 2100, 100), offset), Verdict::Dead);
}

/// A quiet FoundationDB cluster as a lone reaper with a 4 s worker sees
/// it: nothing commits but the reaper's pass, once a second. Each pass
/// reads the version of the previous pass's commit (1 s old), commits,
/// and scans at the version of its own commit: 1 s of versions within
/// a few milliseconds, every time.
#[test]
fn a_quiet_clusters_lumps_are_no_jump() {
    let (c, mut o, w) = (Clock::new(), Observer::new(SLEEP), worker("w"));
    let rec = record(1, 4);
    let mut committed = 0;
    let mut verdict = Verdict::Alive { left: Duration::MAX };
    for ms in (0..=5_000).step_by(1_000) {
        // The pass's write transaction: the last committed version.
        assert_eq!(o.look(c.at(ms, committed)), None, "no restart at {ms} ms");
        // Its commit gets all the time since the previous batch.
        committed = (ms + 1) * 1_000;
        let scan = c.at(ms + 2, committed);
        assert_eq!(o.look(scan), None, "no restart at {} ms", ms + 2);
        verdict = o.judge(&w, &rec, &scan);
        o.end_pass();
    }
    assert_eq!(verdict, Verdict::Dead, "seen unchanged for over 4 s in both measures");
}

#[test]
fn one_batchs_largest_step_is_no_jump_and_more_is() {
    // The master steps at most MAX_READ_TRANSACTION_LIFE_VERSIONS from
    // one batch to the next, however long it waited for it.
    let (c, mut o, w) = (Clock::new(), Observer::new(SLEEP), worker("w"));
    watch(&mut o, &c, &w, &record(1, 1), (0, 100, 100), 0);
    let step = c.at(200, 100_000 + MAX_READ_TRANSACTION_LIFE_VERSIONS);
    assert_eq!(o.look(step), None);
    o.judge(&w, &record(1, 1), &step);
    // Versions as far past the allowance as the local time between
    // the looks (101 ms, twice) and one such step allow, plus one.
    let beyond = step.read_version + 2 * 101_000 + MAX_READ_TRANSACTION_LIFE_VERSIONS + 1;
    assert_eq!(o.look(c.at(300, beyond)), Some(Restart::VersionJump));
}

#[test]
fn a_recovery_is_a_jump_at_the_slowest_cadence_of_a_45_s_timeout() {
    // A 45 s worker: stall bound 11.25 s. The two looks furthest apart
    // that raise no stall: each takes just under the bound, the second
    // starts two bounds after the first ended, 44.9 s in all.
    let (c, mut o, w) = (Clock::new(), Observer::new(Duration::MAX), worker("w"));
    let first = Look { finished: c.at(11_200, 0).started, ..c.at(0, 0) };
    assert_eq!(o.look(first), None);
    o.judge(&w, &record(1, 45), &first);
    let second = |read_version| Look { read_version, finished: c.at(44_900, 0).started, ..c.at(33_700, 0) };
    // Without a recovery: the time, and a batch's catching up.
    let time = 44_900_000;
    let mut calm = Observer::new(Duration::MAX);
    calm.look(first);
    calm.judge(&w, &record(1, 45), &first);
    assert_eq!(calm.look(second(time + MAX_READ_TRANSACTION_LIFE_VERSIONS)), None);
    // With one: MAX_VERSIONS_IN_FLIGHT more.
    assert_eq!(o.look(second(time + MAX_VERSIONS_IN_FLIGHT)), Some(Restart::VersionJump));
}

#[test]
fn versions_going_back_restart_observation() {
    let (c, mut o, w) = (Clock::new(), Observer::new(SLEEP), worker("w"));
    watch(&mut o, &c, &w, &record(1, 1), (0, 500, 100), 1_000_000);
    assert_eq!(o.look(c.at(600, 10)), Some(Restart::VersionBack));
}

#[test]
fn a_slow_look_restarts_observation() {
    let (c, mut o, w) = (Clock::new(), Observer::new(SLEEP), worker("w"));
    let rec = record(1, 1);
    watch(&mut o, &c, &w, &rec, (0, 900, 100), 0);
    // A transaction of the reaper that took 300 ms (the bound is a
    // quarter of the 1 s timeout): the store stalled meanwhile.
    let mut slow = c.at(1000, 1_000_000);
    slow.finished = slow.started + Duration::from_millis(300);
    assert_eq!(o.look(slow), Some(Restart::SlowLook));
    assert_eq!(o.judge(&w, &rec, &slow), Verdict::Alive { left: Duration::from_secs(1) });
}

#[test]
fn a_quiet_gap_restarts_observation() {
    // The reaper did not look for longer than its cadence allows (its
    // process was stopped, its runtime starved): what happened to the
    // store meanwhile is unknown.
    let (c, mut o, w) = (Clock::new(), Observer::new(SLEEP), worker("w"));
    watch(&mut o, &c, &w, &record(1, 1), (0, 200, 100), 0);
    assert_eq!(o.look(c.at(200 + 760, 960_000)), Some(Restart::Quiet));
    assert_eq!(o.watching(), 0);
}

#[test]
fn an_explicit_restart_forgets_everything() {
    // What the reaper does after a failed transaction, and what a new
    // reaper starts with.
    let (c, mut o, w) = (Clock::new(), Observer::new(SLEEP), worker("w"));
    let rec = record(1, 1);
    watch(&mut o, &c, &w, &rec, (0, 900, 100), 0);
    o.restart();
    assert!(matches!(watch(&mut o, &c, &w, &rec, (1000, 2000, 100), 0), Verdict::Alive { .. }));
    assert_eq!(watch(&mut o, &c, &w, &rec, (2100, 2100, 100), 0), Verdict::Dead);
}

#[test]
fn a_changed_record_restarts_that_worker_only() {
    let (c, mut o) = (Clock::new(), Observer::new(SLEEP));
    let (a, b) = (worker("a"), worker("b"));
    let (a1, a2, b1) = (record(1, 1), record(2, 1), record(3, 1));
    for ms in (0..=1100).step_by(100) {
        let look = c.at(ms, ms * 1000);
        o.look(look);
        // a heartbeats at 600 ms; b never does.
        let rec_a = if ms < 600 { &a1 } else { &a2 };
        let va = o.judge(&a, rec_a, &look);
        let vb = o.judge(&b, &b1, &look);
        o.end_pass();
        if ms == 1100 {
            assert!(matches!(va, Verdict::Alive { .. }), "a renewed at 600 ms");
            assert_eq!(vb, Verdict::Dead, "b did not");
        }
    }
    // Another incarnation with the same versionstamp is another record.
    let other = health_value(2, 0, 1, &[8; 16]);
    let look = c.at(1200, 1_200_000);
    o.look(look);
    assert_eq!(o.judge(&a, &other, &look), Verdict::Alive { left: Duration::from_secs(1) });
}

#[test]
fn a_worker_missing_from_a_pass_is_forgotten() {
    let (c, mut o, w) = (Clock::new(), Observer::new(SLEEP), worker("w"));
    watch(&mut o, &c, &w, &record(1, 1), (0, 500, 100), 0);
    o.look(c.at(600, 600_000));
    o.end_pass();
    assert_eq!(o.watching(), 0);
}

#[test]
fn the_stall_bound_is_a_quarter_of_the_smallest_timeout() {
    let (c, mut o) = (Clock::new(), Observer::new(SLEEP));
    assert_eq!(o.stall_bound(), Duration::from_millis(250), "nothing observed: the smallest timeout there is");
    let look = c.at(0, 0);
    o.look(look);
    o.judge(&worker("a"), &record(1, 8), &look);
    assert_eq!(o.stall_bound(), Duration::from_secs(2));
    o.judge(&worker("b"), &record(1, 2), &look);
    assert_eq!(o.stall_bound(), Duration::from_millis(500));
}

#[test]
fn unreadable_records_get_the_default_timeout() {
    assert_eq!(record_timeout(b"\xffjunk"), UNREADABLE_TIMEOUT);
    assert_eq!(record_timeout(&record(1, -5)), UNREADABLE_TIMEOUT);
    assert_eq!(record_timeout(&record(1, 0)), UNREADABLE_TIMEOUT);
    assert_eq!(record_timeout(&record(1, 3)), Duration::from_secs(3));
}

#[test]
fn wall_clock_plays_no_part() {
    // Two records that differ only in their writer's wall clock are
    // judged alike (each is its own record, seen for the same time).
    let (c, mut o) = (Clock::new(), Observer::new(SLEEP));
    let early = health_value(1, 0, 1, &[7; 16]);
    let late = health_value(1, 4_000_000_000, 1, &[7; 16]);
    let mut verdicts = Vec::new();
    for ms in (0..=1100).step_by(100) {
        let look = c.at(ms, ms * 1000);
        o.look(look);
        verdicts.push((o.judge(&worker("a"), &early, &look), o.judge(&worker("b"), &late, &look)));
    }
    assert!(verdicts.iter().all(|(a, b)| a == b), "{verdicts:?}");
    assert_eq!(verdicts.last().map(|v| v.0), Some(Verdict::Dead));
}

#[test]
fn absurd_versions_do_not_overflow() {
    let (c, mut o, w) = (Clock::new(), Observer::new(SLEEP), worker("w"));
    let look = c.at(0, u64::MAX - 1);
    o.look(look);
    o.judge(&w, &record(1, 1), &look);
    let later = c.at(100, u64::MAX);
    assert_eq!(o.look(later), None);
    assert!(matches!(o.judge(&w, &record(1, 1), &later), Verdict::Alive { .. }));
}
