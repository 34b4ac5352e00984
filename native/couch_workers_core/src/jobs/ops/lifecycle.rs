//! A job from its add to its removal: add and add_many, the worker's
//! update and end of a run (finish, fail, release), and anyone's cancel and
//! remove.

use std::collections::HashSet;

use super::helpers::{check_index_keys, check_job_key, check_room_to_run, get_many, new_record, read_record};
use super::run_end::{end_run, Retry, RunEnd};
use super::unique::{check_option_keys, claim, holder};
use super::OpResult;
use crate::error::Error;
use crate::jobs::job::{AddManyError, Fence, Job, JobHandle, JobOpts, JobSpec, JobState, JobVs, NewJob, Schedule};
use crate::jobs::place::{self, earliest_scheduled, place, queue_state, unplace, write_record, Queued};
use crate::jobs::record::{self, Record};
use crate::keyspace::Keyspace;
use crate::store::{StoreError, Tx, MAX_TRANSACTION_SIZE, MAX_VALUE_SIZE};

/// Most jobs in one `add_many`: each needs its own user version (a `u16`)
/// to keep first-in-first-out order within the commit.
pub const MAX_ADD_MANY: usize = 1 << 16;

// ---- add ------------------------------------------------------------------

/// Adds a pending job. `AlreadyExists` if a job of that type and id exists
/// in any state.
pub async fn add(tx: &Tx, ks: &Keyspace, job_type: &[u8], job: &NewJob) -> Result<OpResult<()>, StoreError> {
    add_job(tx, ks, job_type, &JobSpec::from(job), place::wall_ms()).await
}

/// Adds a job with its options: `scheduled` if its schedule is in the
/// future of `now`, else pending. `AlreadyExists` if a job of that type and
/// id exists in any state.
pub async fn add_job(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    job: &JobSpec,
    now: u64,
) -> Result<OpResult<()>, StoreError> {
    let mut rec = match new_record(ks, job_type, job, now) {
        Ok(rec) => rec,
        Err(e) => return Ok(Err(e)),
    };
    if let Err(e) = check_option_keys(ks, job_type, &job.opts) {
        return Ok(Err(e));
    }
    if tx.get(&ks.job(job_type, &job.id), false).await?.is_some() {
        return Ok(Err(Error::AlreadyExists));
    }
    if let Some(key) = &job.opts.unique {
        if let Err(e) = claim(tx, ks, job_type, key, &job.id).await? {
            return Ok(Err(e));
        }
    }
    let before = if job.opts.schedule.is_some() { earliest_scheduled(tx, ks, job_type).await? } else { None };
    let mut queued = Queued::default();
    insert(tx, ks, job_type, &job.id, &mut rec, job.opts.schedule, 0, now, &mut queued);
    queued.wake(tx, ks, job_type, before);
    Ok(Ok(()))
}

/// Claims the unique keys of a batch, all or none: `Duplicate(holder)`
/// for the first key another unended job holds, or that an earlier job
/// of the batch takes (nothing written then).
async fn claim_many(tx: &Tx, ks: &Keyspace, job_type: &[u8], jobs: &[JobSpec]) -> Result<OpResult<()>, StoreError> {
    let mut first: std::collections::HashMap<&[u8], &[u8]> = std::collections::HashMap::new();
    let mut claims = Vec::new();
    for job in jobs {
        let Some(key) = job.opts.unique.as_deref() else { continue };
        if let Some(earlier) = first.insert(key, &job.id) {
            return Ok(Err(Error::Duplicate(earlier.to_vec())));
        }
        claims.push((key, job.id.as_slice()));
    }
    if claims.is_empty() {
        return Ok(Ok(()));
    }
    let holders =
        futures::future::try_join_all(claims.iter().map(|(key, id)| holder(tx, ks, job_type, key, id))).await?;
    if let Some(other) = holders.into_iter().flatten().next() {
        return Ok(Err(Error::Duplicate(other)));
    }
    for (key, id) in claims {
        tx.set(&ks.unique(job_type, key), id);
    }
    Ok(Ok(()))
}

/// Writes a new job: queued as its schedule says, counted in its type.
#[allow(clippy::too_many_arguments)]
fn insert(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    id: &[u8],
    rec: &mut Record,
    schedule: Option<Schedule>,
    user_version: u16,
    now: u64,
    queued: &mut Queued,
) {
    queue_state(rec, schedule, now);
    place(tx, ks, job_type, id, rec, user_version, now);
    tx.atomic_add(&ks.job_type_count(job_type), 1);
    queued.note(rec);
}

/// Adds every job or none: `AlreadyExists(ids)` names the ids that exist
/// (or repeat within the batch). A batch that one transaction cannot hold
/// (over [`MAX_ADD_MANY`] jobs, or an estimated write size over
/// FoundationDB's 10 MB) is refused whole with `transaction_too_large`:
/// splitting it would break the all-or-nothing contract.
pub async fn add_many(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    jobs: &[NewJob],
) -> Result<Result<(), AddManyError>, StoreError> {
    let specs: Vec<JobSpec> = jobs.iter().map(JobSpec::from).collect();
    add_many_jobs(tx, ks, job_type, &specs, place::wall_ms()).await
}

/// [`add_many`] with every job's options.
pub async fn add_many_jobs(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    jobs: &[JobSpec],
    now: u64,
) -> Result<Result<(), AddManyError>, StoreError> {
    if jobs.is_empty() {
        return Ok(Ok(()));
    }
    if jobs.len() > MAX_ADD_MANY {
        return Ok(Err(Error::Store(StoreError::TransactionTooLarge).into()));
    }
    let mut records = Vec::with_capacity(jobs.len());
    let mut size = 0usize;
    for job in jobs {
        let rec = match new_record(ks, job_type, job, now) {
            Ok(rec) => rec,
            Err(e) => return Ok(Err(e.into())),
        };
        if let Err(e) = check_option_keys(ks, job_type, &job.opts) {
            return Ok(Err(e.into()));
        }
        let job_key = ks.job(job_type, &job.id).len();
        // The record and pending key written, and the read conflict range
        // of the existence check (about twice the key).
        // The record, its pending or scheduled key and its index key.
        size += rec.value_len() + 5 * job_key + ks.pending(job_type, rec.priority, &[0; 12], &job.id).len();
        // A unique key: read, written with the id.
        size += job.opts.unique.as_ref().map_or(0, |k| 2 * ks.unique(job_type, k).len() + job.id.len());
        records.push(rec);
    }
    if size > MAX_TRANSACTION_SIZE {
        return Ok(Err(Error::Store(StoreError::TransactionTooLarge).into()));
    }
    let keys: Vec<Vec<u8>> = jobs.iter().map(|j| ks.job(job_type, &j.id)).collect();
    let found = get_many(tx, &keys, false).await?;
    let mut seen = HashSet::with_capacity(jobs.len());
    let mut reported = HashSet::new();
    let mut existing = Vec::new();
    for (job, value) in jobs.iter().zip(&found) {
        let repeated = !seen.insert(job.id.as_slice());
        if (value.is_some() || repeated) && reported.insert(job.id.as_slice()) {
            existing.push(job.id.clone());
        }
    }
    if !existing.is_empty() {
        return Ok(Err(AddManyError::AlreadyExists(existing)));
    }
    if let Err(e) = claim_many(tx, ks, job_type, jobs).await? {
        return Ok(Err(e.into()));
    }
    let before =
        if jobs.iter().any(|j| j.opts.schedule.is_some()) { earliest_scheduled(tx, ks, job_type).await? } else { None };
    let mut queued = Queued::default();
    for (i, (job, rec)) in jobs.iter().zip(records.iter_mut()).enumerate() {
        // i < MAX_ADD_MANY = 2^16, checked above.
        insert(tx, ks, job_type, &job.id, rec, job.opts.schedule, i as u16, now, &mut queued);
    }
    queued.wake(tx, ks, job_type, before);
    Ok(Ok(()))
}

// ---- the worker's side: update, finish, fail, release ----------------------

/// The record of the job `fence` names, if that accept still holds it:
/// running, same worker, same token, and not a job of a removed
/// incarnation of the worker that the sweeper has not reached yet.
async fn owned_record(tx: &Tx, ks: &Keyspace, fence: &Fence) -> Result<OpResult<Record>, StoreError> {
    let Some(rec) = read_record(tx, ks, &fence.job_type, &fence.job_id, false).await? else {
        return Ok(Err(Error::NotFound));
    };
    if rec.state != JobState::Running
        || rec.token != Some(fence.token)
        || rec.worker.as_deref() != Some(&fence.worker[..])
    {
        return Ok(Err(Error::NotOwner));
    }
    if let Some(marker) = tx.get(&ks.orphan(&fence.job_type, &fence.worker), false).await? {
        let accepted = tx.get(&ks.active(&fence.job_type, &fence.worker, &fence.job_id), false).await?;
        let accepted = accepted.and_then(|v| record::decode_active(&v));
        if let (Some((removed, _)), Some(accepted)) = (record::decode_orphan_marker(&marker), accepted) {
            if accepted[..10] < removed[..10] {
                return Ok(Err(Error::NotOwner));
            }
        }
    }
    Ok(Ok(rec))
}

/// Replaces the info of a job the handle holds. If a cancel was requested
/// the job becomes canceled instead (and leaves the worker): `Canceled`.
pub async fn update(tx: &Tx, ks: &Keyspace, fence: &Fence, info: &[u8]) -> Result<OpResult<JobHandle>, StoreError> {
    if let Err(e) = check_job_key(ks, &fence.job_type, &fence.job_id) {
        return Ok(Err(e));
    }
    let mut rec = match owned_record(tx, ks, fence).await? {
        Ok(rec) => rec,
        Err(e) => return Ok(Err(e)),
    };
    let now = place::wall_ms();
    if rec.cancel_requested {
        end_run(tx, ks, &fence.job_type, &fence.job_id, &mut rec, RunEnd::Canceled, 0, now);
        return Ok(Err(Error::Canceled));
    }
    rec.info = info.to_vec();
    // Room to run again too (a release or a lost run queues it).
    if let Err(e) = check_room_to_run(ks, &fence.job_type, &fence.job_id, &rec) {
        return Ok(Err(e));
    }
    write_record(tx, ks, &fence.job_type, &fence.job_id, &mut rec, 0);
    Ok(Ok(JobHandle { job: rec.to_job(&fence.job_type, &fence.job_id, now), token: fence.token, queued_at: None }))
}

/// Ends the run the handle holds as `end` says (finish, fail, release).
pub async fn end(tx: &Tx, ks: &Keyspace, fence: &Fence, end: RunEnd) -> Result<OpResult<Job>, StoreError> {
    if let Err(e) = check_job_key(ks, &fence.job_type, &fence.job_id) {
        return Ok(Err(e));
    }
    let mut rec = match owned_record(tx, ks, fence).await? {
        Ok(rec) => rec,
        Err(e) => return Ok(Err(e)),
    };
    // The size check: what this end writes into the record.
    let mut probe = rec.clone();
    match &end {
        RunEnd::Finished(result) => probe.result = Some(result.clone()),
        RunEnd::Failed { error, .. } => probe.error = Some(error.clone()),
        RunEnd::Released { info: Some(info), .. } => probe.info = info.clone(),
        _ => {}
    }
    if let RunEnd::Released { opts: JobOpts { priority: Some(p), .. }, .. } = &end {
        probe.priority = *p;
    }
    // A finished job stays ended (a resubmit checks its own info); a
    // failed or released one may be queued again, and must fit to run.
    let fits = match &end {
        RunEnd::Finished(_) => probe.value_len() <= MAX_VALUE_SIZE,
        _ => check_room_to_run(ks, &fence.job_type, &fence.job_id, &probe).is_ok(),
    };
    if !fits {
        return Ok(Err(Error::Store(StoreError::ValueTooLarge)));
    }
    if let RunEnd::Released { opts, .. } = &end {
        if let Err(e) = check_index_keys(ks, &fence.job_type, &fence.job_id, opts.priority.unwrap_or(rec.priority)) {
            return Ok(Err(e));
        }
    }
    let now = place::wall_ms();
    // Only an end that can schedule the job needs the earliest scheduled
    // time (to wake the dispatchers if it comes first).
    let may_schedule = rec.resubmit.is_some()
        || matches!(&end, RunEnd::Failed { retry, .. } if *retry != Retry::No)
        || matches!(&end, RunEnd::Released { opts, .. } if opts.schedule.is_some());
    let before = if may_schedule { earliest_scheduled(tx, ks, &fence.job_type).await? } else { None };
    let queued = end_run(tx, ks, &fence.job_type, &fence.job_id, &mut rec, end, 0, now);
    queued.wake(tx, ks, &fence.job_type, before);
    Ok(Ok(rec.to_job(&fence.job_type, &fence.job_id, now)))
}

/// Finishes a job the handle holds (also one with a cancel request).
pub async fn finish(tx: &Tx, ks: &Keyspace, fence: &Fence, result: &[u8]) -> Result<OpResult<Job>, StoreError> {
    end(tx, ks, fence, RunEnd::Finished(result.to_vec())).await
}

// ---- anyone's side: cancel, remove ----------------------------------------

/// Cancels a job: a pending or scheduled one at once, a running one by
/// request (its worker's next update cancels it; a resubmission waiting
/// for the run's end is dropped), an ended one not at all (`Ok`, nothing
/// written). Returns the job as it now is.
pub async fn cancel(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8]) -> Result<OpResult<Job>, StoreError> {
    if let Err(e) = check_job_key(ks, job_type, id) {
        return Ok(Err(e));
    }
    let Some(mut rec) = read_record(tx, ks, job_type, id, false).await? else {
        return Ok(Err(Error::NotFound));
    };
    let now = place::wall_ms();
    match rec.state {
        JobState::Pending | JobState::Scheduled => {
            unplace(tx, ks, job_type, id, &rec);
            rec.state = JobState::Canceled;
            place(tx, ks, job_type, id, &mut rec, 0, now);
        }
        JobState::Running if !rec.cancel_requested || rec.resubmit.is_some() => {
            rec.cancel_requested = true;
            rec.resubmit = None;
            write_record(tx, ks, job_type, id, &mut rec, 0);
        }
        _ => {}
    }
    Ok(Ok(rec.to_job(job_type, id, now)))
}

/// Removes a job in any state; a running one's worker is then refused
/// (`not_found`).
pub async fn remove(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8]) -> Result<OpResult<()>, StoreError> {
    remove_if(tx, ks, job_type, id, None).await
}

/// [`remove`]; with `if_vs`, only if the job's `vs` is still that
/// (`Changed` otherwise; an absent job is `NotFound`).
pub async fn remove_if(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    id: &[u8],
    if_vs: Option<&JobVs>,
) -> Result<OpResult<()>, StoreError> {
    if let Err(e) = check_job_key(ks, job_type, id) {
        return Ok(Err(e));
    }
    let Some(rec) = read_record(tx, ks, job_type, id, false).await? else {
        return Ok(Err(Error::NotFound));
    };
    if if_vs.is_some_and(|vs| *vs != rec.vs) {
        return Ok(Err(Error::Changed));
    }
    remove_record(tx, ks, job_type, id, &rec);
    Ok(Ok(()))
}

/// Clears a job and every key of its state, its type's count included.
pub(crate) fn remove_record(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8], rec: &Record) {
    if !rec.state.is_terminal() {
        place::give_up_unique(tx, ks, job_type, rec);
    }
    unplace(tx, ks, job_type, id, rec);
    crate::jobs::history::clear(tx, ks, job_type, id);
    tx.clear(&ks.job(job_type, id));
    tx.atomic_add(&ks.job_type_count(job_type), -1);
}
