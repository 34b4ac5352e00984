//! How a run ends: [`RunEnd`], the retry policy of a failed run, and
//! [`end_run`], the one place that moves a running job off its worker.

use crate::jobs::history::{self, Outcome};
use crate::jobs::job::{JobOpts, JobState, Schedule};
use crate::jobs::place::{place, queue_state, unplace, Queued};
use crate::jobs::record::{self, Record, Resubmit};
use crate::keyspace::Keyspace;
use crate::store::Tx;

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// `finish` with this result.
    Finished(Vec<u8>),
    /// The worker saw its cancel request (`update`).
    Canceled,
    /// `fail` with this error: retried as `retry` says while attempts
    /// are left, else `failed`.
    Failed { error: Vec<u8>, retry: Retry },
    /// Given back without a failure (`release`, an unregister, a failed
    /// delivery): queued again, `max_attempts` raised by one (unless
    /// `bump` is false: the job never reached its worker).
    Released { opts: JobOpts, info: Option<Vec<u8>>, bump: bool },
    /// Its worker died: a failure with `worker_lost`, retried at once.
    Lost,
    /// Its record did not change for its activity timeout: taken back as
    /// by its worker's death, with `activity_timeout` (`jobs/activity.rs`).
    TimedOut,
}

/// Whether and when a failed run is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// `retry => false`: `failed` at once.
    No,
    /// After this many ms (0: pending at once).
    After(u64),
    /// After the default backoff: `base_ms` × 2^(attempts − 1), capped at
    /// `max_ms`, less a random jitter of up to a quarter (so that jobs that
    /// failed together do not come back together).
    Backoff { base_ms: u64, max_ms: u64 },
}

impl Retry {
    /// The delay before the next try of a job accepted `attempts` times.
    pub fn delay_ms(self, attempts: u64) -> Option<u64> {
        match self {
            Retry::No => None,
            Retry::After(ms) => Some(ms),
            Retry::Backoff { base_ms, max_ms } => {
                let exp = attempts.saturating_sub(1).min(62) as u32;
                let full = base_ms.saturating_mul(1u64 << exp).min(max_ms);
                let jitter = if full >= 4 { rand::random_range(0..=full / 4) } else { 0 };
                Some(full - jitter)
            }
        }
    }
}

/// Ends the run of the running `rec`: it leaves its worker (active key,
/// token) and goes where `end` says, in the caller's transaction. A
/// resubmission made while it ran wins over everything but a cancel. A
/// cancel request wins over a retry or release (nobody would see it
/// otherwise). Returns what it queued.
#[allow(clippy::too_many_arguments)]
pub(crate) fn end_run(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    id: &[u8],
    rec: &mut Record,
    end: RunEnd,
    user_version: u16,
    now: u64,
) -> Queued {
    unplace(tx, ks, job_type, id, rec);
    let resubmit = rec.resubmit.take();
    let cancel = rec.cancel_requested;
    let ended_by = match &end {
        RunEnd::Finished(_) => Outcome::Finished,
        RunEnd::Canceled => Outcome::Canceled,
        RunEnd::Failed { .. } => Outcome::Failed,
        RunEnd::Released { .. } => Outcome::Released,
        RunEnd::Lost => Outcome::Lost,
        RunEnd::TimedOut => Outcome::Timeout,
    };
    let worker = rec.worker.clone().unwrap_or_default();
    let timed_out = end == RunEnd::TimedOut;
    match end {
        RunEnd::Canceled => rec.state = JobState::Canceled,
        RunEnd::Finished(result) => {
            rec.result = Some(result);
            rec.state = JobState::Finished;
        }
        RunEnd::Failed { error, retry } => {
            rec.error = Some(error);
            let retry = retry.delay_ms(rec.attempts).filter(|_| rec.max_attempts.allows_retry(rec.attempts));
            match retry {
                Some(_) if cancel => rec.state = JobState::Canceled,
                Some(delay) => queue_state(rec, Some(Schedule::Delay(delay)), now),
                None => rec.state = JobState::Failed,
            }
        }
        RunEnd::Lost | RunEnd::TimedOut => {
            rec.error = Some(if timed_out { activity_timeout_error() } else { record::worker_lost_error() });
            if cancel {
                rec.state = JobState::Canceled;
            } else if rec.max_attempts.allows_retry(rec.attempts) {
                rec.state = JobState::Pending;
            } else {
                rec.state = JobState::Failed;
            }
        }
        RunEnd::Released { opts, info, bump } => {
            if bump {
                rec.max_attempts = rec.max_attempts.raised();
            }
            if cancel {
                rec.state = JobState::Canceled;
            } else {
                if let Some(info) = info {
                    rec.info = info;
                }
                if let Some(p) = opts.priority {
                    rec.priority = p;
                }
                queue_state(rec, opts.schedule, now);
            }
        }
    }
    let anew = rec.state != JobState::Canceled && resubmit.is_some();
    if anew {
        // A resubmission queues the job anew, attempts from 0: its
        // history starts again.
        history::restart(tx, ks, job_type, id, rec);
    } else {
        // The run's end (its outcome is the run's, its error the run's
        // failure).
        let outcome = history::outcome_of(rec.state, ended_by);
        history::end_run(tx, ks, job_type, id, rec, worker, outcome, now);
    }
    if let Some(r) = resubmit.filter(|_| anew) {
        apply_resubmit(rec, r, now);
    }
    place(tx, ks, job_type, id, rec, user_version, now);
    let mut queued = Queued::default();
    queued.note(rec);
    queued
}

/// The error a run taken back for its activity timeout leaves.
pub(crate) fn activity_timeout_error() -> Vec<u8> {
    br#"{"reason":"activity_timeout"}"#.to_vec()
}

/// Queues `rec` again as `resubmit` says: its info, its options over the
/// job's, attempts 0, no error (a result is kept).
pub(super) fn apply_resubmit(rec: &mut Record, r: Resubmit, now: u64) {
    rec.info = r.info;
    apply_opts(rec, &r.opts);
    rec.attempts = 0;
    rec.error = None;
    queue_state(rec, r.opts.schedule, now);
}

/// The options given replace the job's; the others keep their values.
pub(super) fn apply_opts(rec: &mut Record, opts: &JobOpts) {
    if let Some(p) = opts.priority {
        rec.priority = p;
    }
    if let Some(m) = opts.max_attempts {
        rec.max_attempts = m;
    }
    if let Some(k) = opts.keep {
        rec.keep = k;
    }
    if let Some(g) = &opts.group {
        rec.group = Some(g.clone());
    }
    if let Some(t) = opts.activity_timeout {
        rec.activity_timeout = Some(t);
    }
}
