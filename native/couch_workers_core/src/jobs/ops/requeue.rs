//! Failover: a removed worker's running jobs requeued in the transaction
//! that removes it, and the sweep of what one transaction could not move.

use super::helpers::get_some;
use super::run_end::{end_run, RunEnd};
use super::BATCH_WRITE_BUDGET;
use crate::jobs::job::{JobOpts, JobState, JobVs};
use crate::jobs::place::{self, Queued};
use crate::jobs::record::{self, Record};
use crate::keyspace::Keyspace;
use crate::store::{RangeRequest, StoreError, Tx, Watch};

/// Most running jobs one transaction moves off a removed worker.
pub const REQUEUE_MAX_JOBS: usize = 500;

/// Why a worker's running jobs leave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Departure {
    /// `worker_unregister/1`: released.
    Released,
    /// A death (reaped, or replaced by a new registration of its id):
    /// each job fails with `worker_lost`.
    Lost,
}

impl Departure {
    fn run_end(self) -> RunEnd {
        match self {
            Departure::Released => RunEnd::Released { opts: JobOpts::default(), info: None, bump: true },
            Departure::Lost => RunEnd::Lost,
        }
    }
}

/// What one requeue batch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Batch {
    /// Jobs moved off the worker (to pending, or canceled if a cancel was
    /// requested).
    moved: usize,
    /// Active rows consumed (moved, skipped as newer, or stale).
    consumed: usize,
    /// The byte budget ran out before every row was consumed.
    stopped: bool,
}

/// Which rule each running job of a removed worker follows: the rule of
/// the registration that accepted it. `removed` are the removals an orphan
/// marker records (oldest first); a job accepted before one of them (and
/// after the one before) ran under the registration it ended and follows
/// its rule. A job accepted after all of them follows `after`: the
/// departure being written now, or `None` for the sweeper (a later
/// registration's job, not its to touch).
#[derive(Debug, Clone, Copy)]
struct Rules<'a> {
    removed: &'a [record::Removal],
    after: Option<Departure>,
}

impl Rules<'_> {
    fn departure_of(&self, accepted: Option<JobVs>) -> Option<Departure> {
        let rule = |lost: bool| if lost { Departure::Lost } else { Departure::Released };
        match accepted {
            // An active value this code did not write: the oldest rule.
            None => self.removed.first().map(|&(_, lost)| rule(lost)).or(self.after),
            Some(accepted) => self
                .removed
                .iter()
                .find(|(removed, _)| accepted[..10] < removed[..10])
                .map(|&(_, lost)| rule(lost))
                .or(self.after),
        }
    }
}

/// Requeues the jobs of `rows` (active key-value pairs of one worker, in
/// key order), within the byte budget, each as `rules` says (jobs no rule
/// covers belong to a later registration of the worker and are skipped).
async fn requeue_rows(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    worker: &[u8],
    rows: &[(Vec<u8>, Vec<u8>)],
    rules: Rules<'_>,
) -> Result<Batch, StoreError> {
    let ids: Vec<Option<(Vec<u8>, Departure)>> = rows
        .iter()
        .map(|(key, value)| {
            let id = ks.parse_active_job_id(worker_type, worker, key)?;
            Some((id, rules.departure_of(record::decode_active(value))?))
        })
        .collect();
    let values = get_some(tx, ids.iter().map(|id| id.as_ref().map(|(id, _)| ks.job(worker_type, id))), false).await?;

    let mut batch = Batch::default();
    let mut written = 0usize;
    let mut queued = Queued::default();
    let mut user_version: u16 = 0;
    let now = place::wall_ms();
    for (i, (active_key, _)) in rows.iter().enumerate() {
        let Some((id, departure)) = &ids[i] else {
            // Newer than the removal (a later incarnation's job), or not
            // a key of this worker: not ours to touch.
            if ks.parse_active_job_id(worker_type, worker, active_key).is_none() {
                tx.clear(active_key);
            }
            batch.consumed += 1;
            continue;
        };
        // An unreadable record cannot say this worker runs it: stale.
        match values[i].as_deref().and_then(|v| Record::decode(v).ok()) {
            Some(mut rec) if rec.state == JobState::Running && rec.worker.as_deref() == Some(worker) => {
                let cost = rec.value_len()
                    + 2 * ks.job(worker_type, id).len()
                    + 2 * active_key.len()
                    + ks.pending(worker_type, rec.priority, &[0; 12], id).len();
                if written > 0 && written + cost > BATCH_WRITE_BUDGET {
                    batch.stopped = true;
                    break;
                }
                written += cost;
                // A resubmission may schedule the job: its time counts too.
                queued.merge(end_run(tx, ks, worker_type, id, &mut rec, departure.run_end(), user_version, now));
                user_version = user_version.wrapping_add(1);
                batch.moved += 1;
            }
            // The record no longer says this worker runs it: a stale key.
            _ => tx.clear(active_key),
        }
        batch.consumed += 1;
    }
    queued.wake(tx, ks, worker_type, None);
    Ok(batch)
}

/// Sends the jobs that `worker` of `worker_type` is running back to
/// pending (or to canceled, when a cancel was requested), in the caller's
/// transaction (the one that removes or re-registers the worker). Returns
/// how many it moved.
///
/// At most [`REQUEUE_MAX_JOBS`] jobs and [`BATCH_WRITE_BUDGET`] bytes move
/// in this transaction. If more remain, it writes the orphan marker
/// `("couch_workers", "orphans", WorkerType, Worker) = (RemovalVS,)` (or
/// `(RemovalVS, "lost")`, with the removals of earlier registrations whose
/// jobs still wait: `record::encode_orphan_marker`) and bumps
/// `orphans_vs`: every node's sweeper wakes and moves the rest, in
/// transactions of the same bounds (see [`sweep_orphan`]). Until then the
/// handles of those jobs are refused all the same: `update`/`finish` see
/// the marker and compare it with the job's accept VS.
pub async fn requeue_worker_jobs(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    worker: &[u8],
    departure: Departure,
) -> Result<usize, StoreError> {
    // Jobs an earlier registration of the id left to the sweeper follow
    // that registration's rule, not this departure's.
    let orphan_key = ks.orphan(worker_type, worker);
    let earlier =
        tx.get(&orphan_key, false).await?.and_then(|v| record::decode_orphan_removals(&v)).unwrap_or_default();
    let (begin, end) = ks.active_range(worker_type, worker);
    let rows = tx.get_range(&RangeRequest::new(begin, end).limit(REQUEUE_MAX_JOBS + 1)).await?;
    let take = rows.len().min(REQUEUE_MAX_JOBS);
    let rules = Rules { removed: &earlier, after: Some(departure) };
    let batch = requeue_rows(tx, ks, worker_type, worker, &rows[..take], rules).await?;
    if batch.consumed < rows.len() {
        let lost = departure == Departure::Lost;
        tx.set_versionstamped_value(&orphan_key, &record::encode_orphan_marker(lost, &earlier));
        tx.set_versionstamped_value(&ks.orphans_vs(), &Keyspace::vs_placeholder_value());
    }
    Ok(batch.moved)
}

/// Where a sweep of one orphan marker stands between transactions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepCursor {
    /// The marker's removal VS this sweep works for.
    pub marker: JobVs,
    /// The last active key handled.
    pub after: Vec<u8>,
}

/// One transaction's worth of a sweep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SweepStep {
    /// The marker is gone (cleared now, or by someone else).
    Done { moved: usize },
    /// More to do: call again with the cursor.
    More { moved: usize, cursor: SweepCursor },
}

/// Moves the next batch of a removed worker's leftover running jobs (those
/// accepted before the marker's latest removal VS: jobs a re-registered
/// incarnation took since are left alone), each as the registration that
/// ran it left (released or lost), and clears the marker once its
/// whole active range has been walked. A cursor whose marker was
/// overwritten (the worker was removed again) restarts from the top.
pub async fn sweep_orphan(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    worker: &[u8],
    cursor: Option<&SweepCursor>,
) -> Result<SweepStep, StoreError> {
    let orphan_key = ks.orphan(worker_type, worker);
    let Some(value) = tx.get(&orphan_key, false).await? else {
        return Ok(SweepStep::Done { moved: 0 });
    };
    let Some(removed) = record::decode_orphan_removals(&value) else {
        // Not a marker this code wrote: drop it rather than guess.
        tx.clear(&orphan_key);
        return Ok(SweepStep::Done { moved: 0 });
    };
    // The latest removal names the marker (a cursor of an overwritten one
    // starts again).
    let Some(&(marker, _)) = removed.last() else {
        tx.clear(&orphan_key);
        return Ok(SweepStep::Done { moved: 0 });
    };
    let (mut begin, end) = ks.active_range(worker_type, worker);
    if let Some(c) = cursor.filter(|c| c.marker == marker) {
        begin = c.after.clone();
        begin.push(0);
    }
    let rows = tx.get_range(&RangeRequest::new(begin, end).limit(REQUEUE_MAX_JOBS)).await?;
    let rules = Rules { removed: &removed, after: None };
    let batch = requeue_rows(tx, ks, worker_type, worker, &rows, rules).await?;
    if !batch.stopped && rows.len() < REQUEUE_MAX_JOBS {
        tx.clear(&orphan_key);
        return Ok(SweepStep::Done { moved: batch.moved });
    }
    // A batch always consumes its first row (the budget admits one job
    // whatever its size), so here `consumed >= 1`.
    let after = rows[batch.consumed.max(1) - 1].0.clone();
    Ok(SweepStep::More { moved: batch.moved, cursor: SweepCursor { marker, after } })
}

/// Up to `limit` orphan markers, `(worker type, worker)`, and a watch on
/// `orphans_vs` armed by this transaction.
pub async fn orphans(tx: &Tx, ks: &Keyspace, limit: usize) -> Result<(Vec<(Vec<u8>, Vec<u8>)>, Watch), StoreError> {
    let (begin, end) = ks.orphans_range();
    let rows = tx.get_range(&RangeRequest::new(begin, end).limit(limit).snapshot(true)).await?;
    let list = rows.iter().filter_map(|(k, _)| ks.parse_orphan(k)).collect();
    let key = ks.orphans_vs();
    tx.get(&key, true).await?;
    Ok((list, tx.watch(&key)))
}
