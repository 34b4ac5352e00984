//! The liveness rule: what a reaper must have seen before it may call a
//! worker dead.
//!
//! A heartbeat rewrites the worker's health record (a new versionstamp
//! each time). A worker is dead when this reaper has *itself* seen the
//! same record, byte for byte, for at least the worker's timeout measured
//! both in store versions and on its own monotonic clock, while the store
//! was writable.
//!
//! Why both measures: store versions are the store's order, not its clock.
//! FoundationDB moves them forward by 100 s' worth at every recovery, and
//! the embedded store's versions run on while another process holds
//! SQLite's write lock and no heartbeat can commit. Local time alone would
//! count a stretch in which this reaper could not read the store. Nothing
//! here reads a wall clock, so nodes whose clocks disagree still agree.
//!
//! "While the store was writable" is what the reaper's own transactions
//! show: each pass starts with a write transaction, and every transaction
//! of the reaper is a [`Look`]. The [`Observer`] forgets everything it saw
//! (observation starts again) when:
//!
//! * versions advanced more than the local time between two looks, and
//!   one commit batch's catching up, can explain (a recovery jump);
//! * a look took longer than [`Observer::stall_bound`], or came later after
//!   the previous one than the reaper's cadence allows (the store, or the
//!   reaper itself, stalled), or a transaction of the reaper failed (the
//!   reaper calls [`Observer::restart`]);
//!
//! The cadence: while it observes a worker, the reaper looks at least once
//! per stall bound (it may sleep longer than that only while it observes
//! nobody, when there is nothing to forget);
//! * the reaper starts (a new, empty observer).
//!
//! After a restart a live worker has a whole timeout to heartbeat again
//! before any reaper can reap it; a dead one is reaped one timeout after
//! its last record was first seen, so within its timeout plus one reaper
//! interval of its death.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::keyspace::Keyspace;
use crate::store::{MAX_READ_TRANSACTION_LIFE_VERSIONS, VERSIONS_PER_SECOND};
use crate::workers::MAX_TIMEOUT_S;

/// Versions may advance at most this many times faster than local time
/// between two looks before it counts as a jump. FoundationDB hands out
/// versions at about the rate of its master's clock; twice that rate is
/// beyond any healthy drift (`MAX_VERSION_RATE_MODIFIER`, 10 %, where a
/// version epoch is set) and far below a recovery's 100 s jump.
const JUMP_RATE_FACTOR: u64 = 2;

/// Versions a look may be ahead of the rate allowance without counting as
/// a jump: one commit batch's step at most.
///
/// Why: FoundationDB's master gives each commit batch the previous
/// version plus all the time since the previous batch, at
/// `VERSIONS_PER_SECOND`, capped at `MAX_READ_TRANSACTION_LIFE_VERSIONS`
/// (`getVersion`), and a read version is the last committed one. A commit
/// proxy with nothing to commit sends an empty batch only every
/// `MAX_COMMIT_BATCH_INTERVAL` (2 s), so on a quiet cluster a read version
/// lags the master's clock by up to the time since the last batch (up to
/// 2 s, or as long as this reaper slept when its own commits are all
/// there is), and the next batch makes it up in one step. Between two
/// looks versions therefore advance by the time between them plus at most
/// one such step, never more than `MAX_READ_TRANSACTION_LIFE_VERSIONS`.
/// Half a second of slack took every such lump for a recovery and
/// restarted the observation at each pass, so that a dead worker with a
/// timeout of a few seconds was never reaped. A recovery's
/// `MAX_VERSIONS_IN_FLIGHT` (100 s' worth) is still beyond this slack plus
/// twice the time between two looks as long as those are under 47.5 s
/// apart: always while the smallest timeout observed is under 47 s (the
/// reaper looks at least every two stall bounds, each look taking at most
/// one, see [`Observer::stall_bound`]). A longer timeout outlives any
/// recovery's stall anyway, and its local measure still has to pass in
/// full.
const JUMP_SLACK_VERSIONS: u64 = MAX_READ_TRANSACTION_LIFE_VERSIONS;

/// The timeout applied to a health record that does not parse or holds a
/// timeout no registration can have: the API's default timeout. Such a
/// record is removed (it would otherwise stay in the membership forever),
/// but never sooner than a live worker's record could be.
const UNREADABLE_TIMEOUT: Duration = Duration::from_secs(15);

/// The smallest timeout a registration can have, the stall bound when no
/// worker is observed.
const MIN_TIMEOUT: Duration = Duration::from_secs(1);

/// The versions that `d` spans at [`VERSIONS_PER_SECOND`].
pub fn versions_in(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).saturating_mul(VERSIONS_PER_SECOND / 1_000_000)
}

/// The local time that `versions` span at [`VERSIONS_PER_SECOND`].
fn duration_of(versions: u64) -> Duration {
    Duration::from_micros(versions / (VERSIONS_PER_SECOND / 1_000_000))
}

/// The timeout a stored health record asks for.
pub fn record_timeout(record: &[u8]) -> Duration {
    match Keyspace::parse_health(record).and_then(|h| u64::try_from(h.timeout_s).ok()) {
        Some(s) if (1..=MAX_TIMEOUT_S).contains(&s) => Duration::from_secs(s),
        _ => UNREADABLE_TIMEOUT,
    }
}

/// One transaction of the reaper: the read version it got, and the local
/// instants just before it began and just after it ended (the read version
/// was fixed somewhere between them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Look {
    pub read_version: u64,
    pub started: Instant,
    pub finished: Instant,
}

/// Why observation started again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    /// Versions advanced faster than local time can explain.
    VersionJump,
    /// Versions went backwards.
    VersionBack,
    /// A look took longer than the stall bound.
    SlowLook,
    /// A look came too long after the previous one.
    Quiet,
}

impl Restart {
    pub fn name(self) -> &'static str {
        match self {
            Restart::VersionJump => "version_jump",
            Restart::VersionBack => "version_back",
            Restart::SlowLook => "slow_transaction",
            Restart::Quiet => "reaper_stalled",
        }
    }
}

/// What the observer says about one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not (yet) dead: at least `left` more must pass in both measures.
    Alive { left: Duration },
    /// Seen unchanged for its timeout in both measures.
    Dead,
}

/// Whether `look`, the next after `last` (`None`: the first since
/// observation started), shows the store or the observer stalled, or the
/// store's versions jumping: then what was observed must be forgotten.
/// `bound` is the stall bound (a look may take that long, and come that
/// much later than planned), `max_sleep` the longest the observer plans
/// to wait between two looks. The rule of every observer of liveness: the
/// reaper's ([`Observer`]) and the activity observer's of running jobs
/// (`services/activity/`).
pub fn stall_or_jump(last: Option<&Look>, look: &Look, bound: Duration, max_sleep: Duration) -> Option<Restart> {
    if look.finished.saturating_duration_since(look.started) > bound {
        return Some(Restart::SlowLook);
    }
    let last = last?;
    if look.started.saturating_duration_since(last.finished) > max_sleep.min(bound) + bound {
        return Some(Restart::Quiet);
    }
    let Some(advanced) = look.read_version.checked_sub(last.read_version) else {
        return Some(Restart::VersionBack);
    };
    // The widest local window that can hold both read versions.
    let elapsed = look.finished.saturating_duration_since(last.started);
    let allowed = versions_in(elapsed).saturating_mul(JUMP_RATE_FACTOR).saturating_add(JUMP_SLACK_VERSIONS);
    (advanced > allowed).then_some(Restart::VersionJump)
}

/// The first sighting of a record, kept while it stays unchanged.
#[derive(Debug, Clone)]
struct Sighting {
    record: Vec<u8>,
    timeout: Duration,
    /// The read version it was first seen at.
    version: u64,
    /// The end of that look: the latest moment it can have been written
    /// (so the time credited to it is never more than it was there).
    at: Instant,
    /// The pass that last saw it.
    pass: u64,
}

/// `(worker type, worker id)`.
pub type WorkerId = (Vec<u8>, Vec<u8>);

/// One reaper's observation of the health records.
#[derive(Debug)]
pub struct Observer {
    seen: HashMap<WorkerId, Sighting>,
    last: Option<Look>,
    pass: u64,
    /// The longest the reaper plans to wait between two looks while it
    /// observes a worker (it never plans more than the stall bound).
    max_sleep: Duration,
}

impl Observer {
    /// An observer that has seen nothing (a reaper that just started).
    /// `max_sleep` is the longest the reaper sleeps between passes.
    pub fn new(max_sleep: Duration) -> Self {
        Observer { seen: HashMap::new(), last: None, pass: 0, max_sleep }
    }

    /// Forgets everything seen: after a failed transaction of the reaper,
    /// and from [`Observer::look`] after a jump or a stall.
    pub fn restart(&mut self) {
        self.seen.clear();
        self.last = None;
    }

    /// The end of the last look since observation (re)started.
    pub fn last_finished(&self) -> Option<Instant> {
        self.last.map(|l| l.finished)
    }

    /// Workers under observation.
    pub fn watching(&self) -> usize {
        self.seen.len()
    }

    /// How long one look may take, and by how much it may come later than
    /// planned, before it counts as a stall: a quarter of the smallest
    /// timeout observed. A stall shorter than that, unseen, delays a
    /// heartbeat (renewed every third of the timeout) by less than a
    /// quarter of it, so a live worker still renews within its timeout.
    pub fn stall_bound(&self) -> Duration {
        self.seen.values().map(|s| s.timeout).min().unwrap_or(MIN_TIMEOUT) / 4
    }

    /// Records a look; restarts the observation (and says why) when it
    /// shows a stall or a jump of the store's versions. Every transaction
    /// of the reaper that gets a read version is one.
    pub fn look(&mut self, look: Look) -> Option<Restart> {
        let why = self.check(&look);
        if why.is_some() {
            self.restart();
        }
        self.last = Some(look);
        why
    }

    fn check(&self, look: &Look) -> Option<Restart> {
        if self.seen.is_empty() {
            // Nothing observed, nothing to forget: a reaper that observes
            // nobody sleeps until the store changes.
            return None;
        }
        stall_or_jump(self.last.as_ref(), look, self.stall_bound(), self.max_sleep)
    }

    /// Judges the record of `worker` as read in `look` (recorded with
    /// [`Observer::look`] first). A record other than the one seen before
    /// starts that worker's observation again.
    pub fn judge(&mut self, worker: &WorkerId, record: &[u8], look: &Look) -> Verdict {
        let pass = self.pass;
        let sighting = match self.seen.get_mut(worker) {
            Some(s) if s.record == record => s,
            _ => {
                let timeout = record_timeout(record);
                let fresh =
                    Sighting { record: record.to_vec(), timeout, version: look.read_version, at: look.finished, pass };
                self.seen.insert(worker.clone(), fresh);
                return Verdict::Alive { left: timeout };
            }
        };
        sighting.pass = pass;
        let local = look.started.saturating_duration_since(sighting.at);
        let versions = look.read_version.saturating_sub(sighting.version);
        let local_left = sighting.timeout.saturating_sub(local);
        let versions_left = versions_in(sighting.timeout).saturating_sub(versions);
        if local_left.is_zero() && versions_left == 0 {
            Verdict::Dead
        } else {
            Verdict::Alive { left: local_left.max(duration_of(versions_left)) }
        }
    }

    /// Ends a pass over every health record: forgets the workers it did not
    /// see (removed), so that a later registration starts afresh.
    pub fn end_pass(&mut self) {
        let pass = self.pass;
        self.seen.retain(|_, s| s.pass == pass);
        self.pass += 1;
    }

    /// Forgets `worker` (reaped, or found changed by the reap).
    pub fn forget(&mut self, worker: &WorkerId) {
        self.seen.remove(worker);
    }
}

#[cfg(test)]
mod tests;
