//! What the activity observer has seen of the store since its observation
//! (re)started: its looks, each a read version and the local instant it
//! ended by. A running job's index key holds the versionstamp of the
//! record's last change; the key still there at a look's read version
//! says the record was unchanged from that change up to that look. The
//! job was then seen unchanged for its timeout, as the liveness rule
//! (`liveness/`) asks of a worker, when an earlier look `L` of this
//! observation already read at or after its change and, from `L` to now,
//! both the local monotonic clock and the store's versions moved by the
//! timeout, with no stall or jump of the store seen between
//! ([`liveness::stall_or_jump`]; one restarts the observation, and every
//! job has a whole timeout again). Nothing here reads a wall clock.
//!
//! So one look's cutoff per timeout, the read version of the latest such
//! `L`, says which index keys are due: those whose versionstamp is at or
//! before it. A pass reads those and no others.

use std::collections::VecDeque;
use std::time::Duration;

use crate::liveness::{self, Look, Restart};

/// Looks kept; past this, every other one of the older half is dropped.
/// Dropping a look only makes cutoffs earlier (a later `L`): a job is
/// then taken back later, never sooner.
const MAX_LOOKS: usize = 4096;

/// One observation's looks, oldest first.
#[derive(Debug, Default)]
pub struct Looks {
    /// `(read version, finished)` of each look since the observation
    /// (re)started.
    seen: VecDeque<(u64, std::time::Instant)>,
    last: Option<Look>,
}

impl Looks {
    /// Forgets every look: the next starts the observation again.
    pub fn restart(&mut self) {
        self.seen.clear();
        self.last = None;
    }

    /// Records `look`; restarts the observation first (and says why) if it
    /// shows a stall or a jump, judged with `bound` and `max_sleep` as
    /// [`liveness::stall_or_jump`] does.
    pub fn look(&mut self, look: Look, bound: Duration, max_sleep: Duration) -> Option<Restart> {
        let why = liveness::stall_or_jump(self.last.as_ref(), &look, bound, max_sleep);
        if why.is_some() {
            self.restart();
        }
        self.last = Some(look);
        self.seen.push_back((look.read_version, look.finished));
        if self.seen.len() > MAX_LOOKS {
            self.thin();
        }
        why
    }

    /// Drops every other look of the older half.
    fn thin(&mut self) {
        let half = self.seen.len() / 2;
        let mut i = 0;
        self.seen.retain(|_| {
            i += 1;
            i > half || i % 2 == 1
        });
    }

    /// The last look recorded since the observation (re)started.
    pub fn last(&self) -> Option<&Look> {
        self.last.as_ref()
    }

    /// The highest commit version at or before which a record unchanged
    /// at the look `now` (recorded already) has been seen unchanged for
    /// `timeout` in both measures; `None` if none has yet.
    pub fn cutoff(&self, timeout: Duration, now: &Look) -> Option<u64> {
        let versions = liveness::versions_in(timeout);
        self.seen
            .iter()
            .rev()
            .find(|(version, finished)| {
                now.started.saturating_duration_since(*finished) >= timeout
                    && now.read_version.saturating_sub(*version) >= versions
            })
            .map(|(version, _)| *version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::VERSIONS_PER_SECOND;
    use std::time::Instant;

    const V: u64 = VERSIONS_PER_SECOND;
    const S: Duration = Duration::from_secs(1);

    fn at(t0: Instant, ms: u64, version: u64) -> Look {
        let started = t0 + Duration::from_millis(ms);
        Look { read_version: version, started, finished: started }
    }

    /// Looks every 200 ms from `from` ms for `n` looks, versions with time.
    fn steady(looks: &mut Looks, t0: Instant, from: u64, n: u64) -> Look {
        let mut last = at(t0, from, from * V / 1000);
        for i in 0..n {
            let ms = from + i * 200;
            last = at(t0, ms, ms * V / 1000);
            assert_eq!(looks.look(last, S / 4 * 2, S / 4), None, "a steady look at {ms} ms");
        }
        last
    }

    #[test]
    fn a_change_is_due_once_both_measures_passed_since_a_look_that_saw_it() {
        let t0 = Instant::now();
        let mut looks = Looks::default();
        let now = steady(&mut looks, t0, 0, 6); // 0 .. 1000 ms
        // 1 s since the first look (0 ms, version 0): the first due.
        assert_eq!(looks.cutoff(S, &now), Some(0));
        assert_eq!(looks.cutoff(2 * S, &now), None, "nothing seen 2 s ago");
        let now = steady(&mut looks, t0, 1200, 5); // .. 2000 ms
        assert_eq!(looks.cutoff(S, &now), Some(V), "the look at 1000 ms, version 1 s");
    }

    #[test]
    fn versions_that_did_not_move_keep_a_change_from_being_due() {
        let t0 = Instant::now();
        let mut looks = Looks::default();
        for i in 0..11u64 {
            // Local time moves, the store's versions barely do.
            let look = at(t0, i * 200, 1000 + i);
            looks.look(look, S, S);
        }
        let now = *looks.last().unwrap();
        assert_eq!(looks.cutoff(S, &now), None);
    }

    #[test]
    fn a_jump_or_a_stall_starts_the_observation_again() {
        let t0 = Instant::now();
        let mut looks = Looks::default();
        steady(&mut looks, t0, 0, 10); // .. 1800 ms
        // A recovery: versions 100 s ahead.
        let jump = at(t0, 2000, 2 * V + 100 * V);
        assert_eq!(looks.look(jump, S / 2, S / 4), Some(Restart::VersionJump));
        assert_eq!(looks.cutoff(S, &jump), None, "forgotten: a whole timeout again");
        // A stall: the next look comes 2 s later.
        let stalled = at(t0, 4000, 104 * V);
        assert_eq!(looks.look(stalled, S / 2, S / 4), Some(Restart::Quiet));
        let after = at(t0, 5100, 105 * V + V / 10);
        // (Too late again: a restart; nothing is due from before it.)
        looks.look(after, S / 2, S / 4);
        assert_eq!(looks.cutoff(S, &after), None);
    }

    #[test]
    fn thinning_keeps_the_oldest_look_and_only_delays() {
        let t0 = Instant::now();
        let mut looks = Looks::default();
        let n = MAX_LOOKS as u64 + 10;
        let mut last = at(t0, 0, 0);
        for i in 0..n {
            last = at(t0, i * 10, i * 10 * V / 1000);
            looks.look(last, S * 10, S * 10);
        }
        assert!(looks.seen.len() <= MAX_LOOKS);
        assert_eq!(looks.seen.front().map(|l| l.0), Some(0), "the first look stays");
        let long = Duration::from_millis((n - 1) * 10);
        assert_eq!(looks.cutoff(long, &last), Some(0));
    }
}
