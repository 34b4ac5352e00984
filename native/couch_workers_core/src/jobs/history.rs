//! A job's run history: its last [`HISTORY_RUNS`] runs, each written in
//! the transactions that start and end the run (no transaction of its
//! own). Two keys per run, both written blind (no read, so no conflict):
//! the start `(Run, 0)` at the accept, the end `(Run, 1)` at the run's
//! end, `Run` being the attempt number the accept gave the job. From the
//! eleventh run on, the accept also clears the run `HISTORY_RUNS` behind
//! it. A resubmit that queues the job anew starts its attempts at 0
//! again, and clears the history in its transaction (rare, unlike
//! accepts, which write one key). Keys and values: `docs/keyspace.md`
//! ("history").

use foundationdb_tuple::{pack, unpack, Bytes};

use super::job::JobState;
use crate::keyspace::Keyspace;
use crate::store::{RangeRequest, StoreError, Tx};

fn key_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// How many runs a job's history keeps.
pub const HISTORY_RUNS: u64 = 10;

/// The format version of history values.
const HISTORY_FORMAT: i64 = 1;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Not ended yet.
    Running,
    Finished,
    /// Failed, with no retry left (or none asked for).
    Failed,
    /// Failed, and queued to be tried again.
    Retried,
    /// Given back (`release`, an unregister).
    Released,
    /// Its worker died (reaped, replaced, its owner exited).
    Lost,
    Canceled,
    /// Taken back from its worker: its record did not change for its
    /// activity timeout (`jobs/activity.rs`), whether it was queued again
    /// or, its attempts spent, failed.
    Timeout,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Running => "running",
            Outcome::Finished => "finished",
            Outcome::Failed => "failed",
            Outcome::Retried => "retried",
            Outcome::Released => "released",
            Outcome::Lost => "lost",
            Outcome::Canceled => "canceled",
            Outcome::Timeout => "timeout",
        }
    }

    fn from_name(name: &[u8]) -> Option<Outcome> {
        [
            Outcome::Running,
            Outcome::Finished,
            Outcome::Failed,
            Outcome::Retried,
            Outcome::Released,
            Outcome::Lost,
            Outcome::Canceled,
            Outcome::Timeout,
        ]
        .into_iter()
        .find(|o| o.name().as_bytes() == name)
    }
}

/// One run of a job, as its history shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// The attempt number the accept gave the job.
    pub attempt: u64,
    pub worker: Vec<u8>,
    /// Unix ms on the accepting node's wall clock (informational).
    pub started_at: u64,
    /// Unix ms on the ending node's wall clock; `None` while it runs.
    pub ended_at: Option<u64>,
    pub outcome: Outcome,
    /// The run's failure, a JSON object (`failed`, `retried`, `lost`,
    /// `timeout`).
    pub error: Option<Vec<u8>>,
}

/// The start of run `attempt`, in the accept's transaction.
pub(crate) fn write_start(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8], attempt: u64, worker: &[u8], now: u64) {
    let run = key_i64(attempt);
    // The run `HISTORY_RUNS` behind this one goes (each accept takes one,
    // so no older one is left).
    if attempt > HISTORY_RUNS {
        let old = run - key_i64(HISTORY_RUNS);
        tx.clear_range(&ks.history_run(job_type, id, old), &ks.history_run(job_type, id, old + 1));
    }
    tx.set(&ks.history_part(job_type, id, run, 0), &pack(&(HISTORY_FORMAT, Bytes::from(worker), key_i64(now))));
}

/// The end of run `attempt`, in the transaction that ends it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_end(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    id: &[u8],
    attempt: u64,
    outcome: Outcome,
    error: Option<&[u8]>,
    now: u64,
) {
    let value = pack(&(HISTORY_FORMAT, key_i64(now), Bytes::from(outcome.name().as_bytes()), error.map(Bytes::from)));
    tx.set(&ks.history_part(job_type, id, key_i64(attempt), 1), &value);
}

/// How a run that `end_run` ended shows: by the state it left the job
/// in and how it ended.
pub(crate) fn outcome_of(state: JobState, ended_by: Outcome) -> Outcome {
    match state {
        JobState::Canceled => Outcome::Canceled,
        JobState::Finished => Outcome::Finished,
        // A timeout is told as such, also when it spent the last attempt.
        _ if ended_by == Outcome::Timeout => Outcome::Timeout,
        JobState::Failed => Outcome::Failed,
        _ if ended_by == Outcome::Failed => Outcome::Retried,
        _ => ended_by,
    }
}

/// Clears the job's history (the job is removed, or queued anew by a
/// resubmit, which starts its attempts at 0 again).
pub(crate) fn clear(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8]) {
    let (begin, end) = ks.history_range(job_type, id);
    tx.clear_range(&begin, &end);
}

/// The job's runs, newest first (at most [`HISTORY_RUNS`]). Parts that do
/// not decode are skipped: the history is informational.
pub async fn read(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8], snapshot: bool) -> Result<Vec<Run>, StoreError> {
    let (begin, end) = ks.history_range(job_type, id);
    let rows = tx.get_range(&RangeRequest::new(begin, end).snapshot(snapshot)).await?;
    let mut runs: Vec<Run> = Vec::new();
    for (key, value) in rows {
        let Some((run, part)) = ks.parse_history(job_type, id, &key) else { continue };
        let Ok(attempt) = u64::try_from(run) else { continue };
        match part {
            0 => {
                let Ok((HISTORY_FORMAT, worker, started)) = unpack::<(i64, Bytes, i64)>(&value) else { continue };
                runs.push(Run {
                    attempt,
                    worker: worker.into_owned(),
                    started_at: u64::try_from(started).unwrap_or(0),
                    ended_at: None,
                    outcome: Outcome::Running,
                    error: None,
                });
            }
            1 => {
                let Some(last) = runs.last_mut().filter(|r| r.attempt == attempt) else { continue };
                let Ok((HISTORY_FORMAT, ended, outcome, error)) = unpack::<(i64, i64, Bytes, Option<Bytes>)>(&value)
                else {
                    continue;
                };
                let Some(outcome) = Outcome::from_name(&outcome) else { continue };
                last.ended_at = Some(u64::try_from(ended).unwrap_or(0));
                last.outcome = outcome;
                last.error = error.map(Bytes::into_owned);
            }
            _ => {}
        }
    }
    runs.reverse();
    runs.truncate(HISTORY_RUNS as usize);
    Ok(runs)
}
