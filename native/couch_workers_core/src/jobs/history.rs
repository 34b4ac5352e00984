//! A job's run history: its last [`HISTORY_RUNS`] runs, kept in the
//! transactions that start and end runs (no transaction of its own, and
//! no key of its own for the common run).
//!
//! The job's current or last run lives in its record
//! (`Record::run_started_at`, `Record::run_ended`): the accept writes the
//! record anyway, and so does the transaction that ends the run, so a job
//! that runs once writes no history key at all. The accept of the next
//! run moves the last one into a key of its own, `(Run, 2)`, written blind
//! (no read, so no conflict), `Run` being the attempt number its accept
//! gave it; from the eleventh run on it also clears the run
//! `HISTORY_RUNS` behind the new one. A resubmit that queues the job anew
//! starts its attempts at 0 again and clears the history in its
//! transaction. Runs started by an older version of this code left two
//! keys, a start `(Run, 0)` and an end `(Run, 1)`: still read, and a run
//! whose start is such a key ends with such a key. Keys and values:
//! `docs/keyspace.md` ("history").

use foundationdb_tuple::{pack, unpack, Bytes};

pub use super::job::Outcome;
use super::job::JobState;
use super::record::{Record, RunEnded};
use crate::keyspace::Keyspace;
use crate::store::{RangeRequest, StoreError, Tx};

fn key_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// How many runs a job's history keeps.
pub const HISTORY_RUNS: u64 = 10;

/// The format version of history values.
const HISTORY_FORMAT: i64 = 1;

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

/// The part of a run's key that holds a whole ended run.
const PART_RUN: i64 = 2;

/// The parts of a run started by an older version: its start and its end.
const PART_START: i64 = 0;
const PART_END: i64 = 1;

/// A run starts: `rec` is about to be written running, its
/// `attempts` the new run's number. Moves the record's last run, if it
/// has one, into its key, clears the run [`HISTORY_RUNS`] behind, and
/// notes the start in the record.
pub(crate) fn start_run(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8], rec: &mut Record, now: u64) {
    let run = key_i64(rec.attempts);
    if let (Some(started), Some(ended)) = (rec.run_started_at, rec.run_ended.take()) {
        let error = run_error(ended.outcome, rec);
        let value = pack(&(
            HISTORY_FORMAT,
            Bytes::from(ended.worker.as_slice()),
            key_i64(started),
            key_i64(ended.ended_at),
            Bytes::from(ended.outcome.name().as_bytes()),
            error.map(Bytes::from),
        ));
        tx.set(&ks.history_part(job_type, id, run - 1, PART_RUN), &value);
    }
    // The kept runs are the nine before this one (keys) and this one (the
    // record): the run `HISTORY_RUNS` behind goes, whatever its keys.
    if rec.attempts > HISTORY_RUNS {
        let old = run - key_i64(HISTORY_RUNS);
        tx.clear_range(&ks.history_run(job_type, id, old), &ks.history_run(job_type, id, old + 1));
    }
    rec.run_started_at = Some(now);
    rec.run_ended = None;
}

/// The running run of `rec` ends (in the transaction that ends it), run
/// by `worker`, as `outcome`: noted in the record, whose error is then the
/// run's failure. A run whose start an older version wrote in a key gets
/// its end in a key beside it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn end_run(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    id: &[u8],
    rec: &mut Record,
    worker: Vec<u8>,
    outcome: Outcome,
    now: u64,
) {
    if rec.run_started_at.is_some() {
        rec.run_ended = Some(RunEnded { worker, ended_at: now, outcome });
        return;
    }
    let error = run_error(outcome, rec);
    let value = pack(&(HISTORY_FORMAT, key_i64(now), Bytes::from(outcome.name().as_bytes()), error.map(Bytes::from)));
    tx.set(&ks.history_part(job_type, id, key_i64(rec.attempts), PART_END), &value);
}

/// The error of `rec`'s last run, ended as `outcome`: the record's, for a
/// failure (the record's error is the last failure's).
fn run_error(outcome: Outcome, rec: &Record) -> Option<&[u8]> {
    if outcome.is_failure() {
        rec.error.as_deref()
    } else {
        None
    }
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

/// Clears the job's history keys (the job is removed).
pub(crate) fn clear(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8]) {
    let (begin, end) = ks.history_range(job_type, id);
    tx.clear_range(&begin, &end);
}

/// Starts the history again: the job is queued anew by a resubmit, which
/// starts its attempts at 0 again. Its keys go, and the run its record
/// holds.
pub(crate) fn restart(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8], rec: &mut Record) {
    clear(tx, ks, job_type, id);
    rec.run_started_at = None;
    rec.run_ended = None;
}

/// The runs of the job whose record is `rec`, newest first (at most
/// [`HISTORY_RUNS`]): its keys and the run its record holds. Keys that do
/// not decode are skipped: the history is informational.
pub(crate) async fn read(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    id: &[u8],
    rec: &Record,
    snapshot: bool,
) -> Result<Vec<Run>, StoreError> {
    let (begin, end) = ks.history_range(job_type, id);
    let rows = tx.get_range(&RangeRequest::new(begin, end).snapshot(snapshot)).await?;
    let mut runs: Vec<Run> = Vec::new();
    for (key, value) in rows {
        let Some((run, part)) = ks.parse_history(job_type, id, &key) else { continue };
        let Ok(attempt) = u64::try_from(run) else { continue };
        match part {
            PART_RUN => {
                let Ok((HISTORY_FORMAT, worker, started, ended, outcome, error)) =
                    unpack::<(i64, Bytes, i64, i64, Bytes, Option<Bytes>)>(&value)
                else {
                    continue;
                };
                let Some(outcome) = Outcome::from_name(&outcome) else { continue };
                runs.push(Run {
                    attempt,
                    worker: worker.into_owned(),
                    started_at: u64::try_from(started).unwrap_or(0),
                    ended_at: Some(u64::try_from(ended).unwrap_or(0)),
                    outcome,
                    error: error.map(Bytes::into_owned),
                });
            }
            PART_START => {
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
            PART_END => {
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
    if let Some(current) = record_run(rec) {
        runs.retain(|r| r.attempt != current.attempt);
        runs.push(current);
    }
    runs.reverse();
    runs.truncate(HISTORY_RUNS as usize);
    Ok(runs)
}

/// The run `rec` holds, if any: running, or its last until the next
/// accept.
fn record_run(rec: &Record) -> Option<Run> {
    let started_at = rec.run_started_at?;
    let run = match &rec.run_ended {
        Some(ended) => Run {
            attempt: rec.attempts,
            worker: ended.worker.clone(),
            started_at,
            ended_at: Some(ended.ended_at),
            outcome: ended.outcome,
            error: run_error(ended.outcome, rec).map(<[u8]>::to_vec),
        },
        None => Run {
            attempt: rec.attempts,
            worker: rec.worker.clone().unwrap_or_default(),
            started_at,
            ended_at: None,
            outcome: Outcome::Running,
            error: None,
        },
    };
    Some(run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::job::JobOpts;
    use crate::store::sim::{SimOptions, SimStore};
    use crate::store::{run, Database, TxOptions};

    /// A run an older version started (its record without the run's
    /// fields, its start a key of its own) and this version ends: the end
    /// is a key of its own too (part 1), and the two read as one run.
    #[tokio::test]
    async fn a_run_an_older_version_started_ends_in_its_own_key() {
        let sim = SimStore::new(SimOptions::new(3));
        let ks = Keyspace::new(&sim.prefix());
        let k = &ks;
        let runs = run(sim.as_ref(), TxOptions::write(), |tx| async move {
            let mut rec = Record::new(b"{}".to_vec(), &JobOpts::default());
            (rec.state, rec.worker, rec.attempts) = (JobState::Running, Some(b"w1".to_vec()), 1);
            tx.set(&k.history_part(b"t", b"a", 1, PART_START), &pack(&(HISTORY_FORMAT, Bytes::from(&b"w1"[..]), 1_000i64)));
            end_run(&tx, k, b"t", b"a", &mut rec, b"w1".to_vec(), Outcome::Finished, 2_000);
            rec.state = JobState::Finished;
            assert_eq!(rec.run_ended, None, "nothing in the record");
            let (begin, end) = k.history_range(b"t", b"a");
            let keys = tx.get_range(&RangeRequest::new(begin, end)).await?;
            let parts: Vec<_> = keys.iter().filter_map(|(key, _)| k.parse_history(b"t", b"a", key)).collect();
            assert_eq!(parts, vec![(1, PART_START), (1, PART_END)]);
            read(&tx, k, b"t", b"a", &rec, false).await
        })
        .await
        .expect("history");
        let want =
            Run { attempt: 1, worker: b"w1".to_vec(), started_at: 1_000, ended_at: Some(2_000), outcome: Outcome::Finished, error: None };
        assert_eq!(runs, vec![want]);
    }
}
