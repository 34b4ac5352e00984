//! `resubmit`: add the job, or run it again.

use super::helpers::{check_index_keys, check_room_to_run, read_record};
use super::lifecycle::add_job;
use super::run_end::{apply_opts, apply_resubmit};
use super::unique::{change, check_option_keys};
use super::OpResult;
use crate::error::Error;
use crate::jobs::job::{JobOpts, JobSpec, JobState, JobVs, Schedule};
use crate::jobs::place::{earliest_scheduled, place, queue_state, unplace, write_record, Queued};
use crate::jobs::record::{Record, Resubmit};
use crate::keyspace::Keyspace;
use crate::store::{StoreError, Tx, MAX_VALUE_SIZE};

/// The record, if `if_vs` (when given) still matches it: `Changed` when
/// the job changed since or is gone.
async fn read_if(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    id: &[u8],
    if_vs: Option<&JobVs>,
) -> Result<OpResult<Option<Record>>, StoreError> {
    let rec = read_record(tx, ks, job_type, id, false).await?;
    match (if_vs, &rec) {
        (Some(vs), Some(r)) if r.vs != *vs => Ok(Err(Error::Changed)),
        (Some(_), None) => Ok(Err(Error::Changed)),
        _ => Ok(Ok(rec)),
    }
}

/// Adds the job, or runs it again (`job_resubmit/4`, docs/api.md): absent,
/// it is added; queued, its info and the given options replace the job's
/// and it stays queued once; running, the resubmission waits in the
/// record for the run's end; ended, it is queued again with attempts 0
/// and no error. With `if_vs`, only if the job exists with that `vs`.
#[allow(clippy::too_many_arguments)]
pub async fn resubmit(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    id: &[u8],
    info: &[u8],
    opts: &JobOpts,
    if_vs: Option<&JobVs>,
    now: u64,
) -> Result<OpResult<()>, StoreError> {
    if let Err(e) = check_option_keys(ks, job_type, opts) {
        return Ok(Err(e));
    }
    let rec = match read_if(tx, ks, job_type, id, if_vs).await? {
        Ok(rec) => rec,
        Err(e) => return Ok(Err(e)),
    };
    let Some(mut rec) = rec else {
        let job = JobSpec { id: id.to_vec(), info: info.to_vec(), opts: opts.clone() };
        return add_job(tx, ks, job_type, &job, now).await;
    };
    if let Err(e) = check_index_keys(ks, job_type, id, opts.priority.unwrap_or(rec.priority)) {
        return Ok(Err(e));
    }
    // The key it holds until it ends, or takes again when queued anew
    // (a unique key given replaces the job's own); claimed after every
    // other check, so that a refusal writes nothing.
    let (held, wanted) = match rec.state.is_terminal() {
        false => (rec.unique.clone(), opts.unique.clone()),
        true => (None, opts.unique.clone().or(rec.unique.clone())),
    };
    let (held, wanted) = (held.as_deref(), wanted.as_deref());
    let unique = wanted.map(<[u8]>::to_vec).or(rec.unique.clone());
    let before = earliest_scheduled(tx, ks, job_type).await?;
    let mut queued = Queued::default();
    match rec.state {
        JobState::Running => {
            rec.unique = unique;
            // The key is the job's from now (claimed before the write), not at the run's end.
            let opts = JobOpts { unique: None, ..opts.clone() };
            rec.resubmit = Some(Resubmit { info: info.to_vec(), opts });
            // The running record holds both infos; the job queued again
            // at the run's end holds the new one, and must fit to run.
            let mut after = rec.clone();
            if let Some(r) = after.resubmit.take() {
                apply_resubmit(&mut after, r, now);
            }
            if rec.value_len() > MAX_VALUE_SIZE || check_room_to_run(ks, job_type, id, &after).is_err() {
                return Ok(Err(Error::Store(StoreError::ValueTooLarge)));
            }
            if let Err(e) = change(tx, ks, job_type, id, held, wanted).await? {
                return Ok(Err(e));
            }
            write_record(tx, ks, job_type, id, &mut rec, 0);
        }
        JobState::Scheduled | JobState::Pending => {
            let mut next = rec.clone();
            next.info = info.to_vec();
            next.unique = unique;
            apply_opts(&mut next, opts);
            let schedule = match opts.schedule {
                Some(s) => Some(s),
                None => next.run_at.filter(|_| next.state == JobState::Scheduled).map(Schedule::RunAt),
            };
            queue_state(&mut next, schedule, now);
            if let Err(e) = check_room_to_run(ks, job_type, id, &next) {
                return Ok(Err(e));
            }
            if let Err(e) = change(tx, ks, job_type, id, held, wanted).await? {
                return Ok(Err(e));
            }
            unplace(tx, ks, job_type, id, &rec);
            place(tx, ks, job_type, id, &mut next, 0, now);
            queued.note(&next);
        }
        JobState::Finished | JobState::Canceled | JobState::Failed => {
            let mut next = rec.clone();
            next.unique = unique;
            apply_resubmit(&mut next, Resubmit { info: info.to_vec(), opts: opts.clone() }, now);
            // Attempts from 0 again: so is its history.
            crate::jobs::history::restart(tx, ks, job_type, id, &mut next);
            if let Err(e) = check_room_to_run(ks, job_type, id, &next) {
                return Ok(Err(e));
            }
            if let Err(e) = change(tx, ks, job_type, id, held, wanted).await? {
                return Ok(Err(e));
            }
            unplace(tx, ks, job_type, id, &rec);
            place(tx, ks, job_type, id, &mut next, 0, now);
            queued.note(&next);
        }
    }
    queued.wake(tx, ks, job_type, before);
    Ok(Ok(()))
}
