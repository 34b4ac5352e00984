//! The schedules' transactional operations, each inside a transaction
//! of the caller's: set, remove, list, and a slot's firing, which
//! creates its job (`jobs::ops::add_job`) and moves the schedule to its
//! next slot in the same transaction. The slot's job id is
//! `ScheduleId@T`; the record is read for a write, so two nodes that fire
//! the same slot conflict, and the one that retries finds the schedule
//! moved on and creates nothing: one job per slot.

use crate::error::Error;
use crate::jobs::{ops as job_ops, JobOpts, JobSpec, JobState};
use crate::keyspace::Keyspace;
use crate::store::{RangeRequest, StoreError, Tx};

use super::record::Record;
use super::spec::Spec;

/// A schedule as `schedules/1` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleEntry {
    pub id: Vec<u8>,
    /// The spec, a normalized JSON object.
    pub spec_json: Vec<u8>,
    pub info: Vec<u8>,
    pub opts: JobOpts,
    /// Unix ms of its next slot.
    pub next_run_at: u64,
    /// The id of the last job a slot created.
    pub last_run: Option<Vec<u8>>,
}

/// The id of the job of `schedule_id`'s slot `at`.
pub fn slot_job_id(schedule_id: &[u8], at: u64) -> Vec<u8> {
    let mut id = schedule_id.to_vec();
    id.push(b'@');
    id.extend_from_slice(at.to_string().as_bytes());
    id
}

/// Marks a change of the schedules: every runner re-reads its first due
/// slot (a blind versionstamped set: setters never conflict on it).
fn mark_changed(tx: &Tx, ks: &Keyspace) {
    tx.set_versionstamped_value(&ks.schedules_vs(), &Keyspace::vs_placeholder_value());
}

async fn read(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8]) -> Result<Option<Record>, StoreError> {
    let raw = tx.get(&ks.schedule(job_type, id), false).await?;
    Ok(raw.and_then(|v| Record::decode(&v)))
}

/// Sets (or replaces) a schedule: its next slot is the first at or after
/// `now`; a replaced schedule's last run is kept (for `overlap`).
#[allow(clippy::too_many_arguments)]
pub async fn set(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    id: &[u8],
    spec: &Spec,
    info: &[u8],
    opts: &JobOpts,
    now: u64,
) -> Result<Result<(), Error>, StoreError> {
    let Some(next) = spec.first_slot_from(now) else {
        return Ok(Err(Error::BadSchedule("the spec has no slot after now".into())));
    };
    let old = read(tx, ks, job_type, id).await?;
    if let Some(old) = &old {
        tx.clear(&ks.schedule_due(as_i64(old.next_run_at), job_type, id));
    }
    let record = Record {
        spec_json: spec.to_json(),
        info: info.to_vec(),
        opts: JobOpts { schedule: None, ..opts.clone() },
        next_run_at: next,
        last_run: old.and_then(|o| o.last_run),
    };
    let value = record.encode();
    if let Err(e) = crate::error::check_value(&value) {
        return Ok(Err(e));
    }
    tx.set(&ks.schedule(job_type, id), &value);
    tx.set(&ks.schedule_due(as_i64(next), job_type, id), b"");
    mark_changed(tx, ks);
    Ok(Ok(()))
}

/// Removes a schedule (`NotFound` if there is none); the jobs its slots
/// created stay.
pub async fn remove(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8]) -> Result<Result<(), Error>, StoreError> {
    let key = ks.schedule(job_type, id);
    let Some(raw) = tx.get(&key, false).await? else { return Ok(Err(Error::NotFound)) };
    if let Some(old) = Record::decode(&raw) {
        tx.clear(&ks.schedule_due(as_i64(old.next_run_at), job_type, id));
    }
    tx.clear(&key);
    mark_changed(tx, ks);
    Ok(Ok(()))
}

/// The type's schedules, in id order.
pub async fn list(tx: &Tx, ks: &Keyspace, job_type: &[u8]) -> Result<Vec<ScheduleEntry>, StoreError> {
    let (begin, end) = ks.schedules_range(job_type);
    let rows = tx.get_range(&RangeRequest::new(begin, end)).await?;
    Ok(rows
        .into_iter()
        .filter_map(|(key, value)| {
            let id = ks.parse_schedule(job_type, &key)?;
            let r = Record::decode(&value)?;
            Some(ScheduleEntry {
                id,
                spec_json: r.spec_json,
                info: r.info,
                opts: r.opts,
                next_run_at: r.next_run_at,
                last_run: r.last_run,
            })
        })
        .collect())
}

/// The job types that have at least one schedule, in byte order. Skips
/// from type to type (a tuple layer's distinct-prefix scan): one one-key
/// snapshot read finds the next type's first record, the next starts past
/// that type's range, so the cost is one read per type, whatever the
/// number of its schedules.
pub async fn job_types(tx: &Tx, ks: &Keyspace) -> Result<Vec<Vec<u8>>, StoreError> {
    let (mut from, end) = ks.all_schedules_range();
    let mut types = Vec::new();
    loop {
        let first = tx.get_range(&RangeRequest::new(from.clone(), end.clone()).limit(1).snapshot(true)).await?;
        let Some((key, _)) = first.into_iter().next() else { return Ok(types) };
        match ks.schedule_type_of(&key) {
            Some(job_type) => {
                from = ks.schedules_range(&job_type).1;
                types.push(job_type);
            }
            None => {
                // A key of no shape of ours: step over it alone.
                from = key;
                from.push(0x00);
            }
        }
    }
}

/// A due key: `(next_run_at, job type, schedule id)`.
pub type DueKey = (u64, Vec<u8>, Vec<u8>);

/// The first `limit` due keys (a snapshot read: the firing re-reads each
/// record for its write).
pub async fn first_due(tx: &Tx, ks: &Keyspace, limit: usize) -> Result<Vec<DueKey>, StoreError> {
    let (begin, end) = ks.schedule_due_range();
    let rows = tx.get_range(&RangeRequest::new(begin, end).limit(limit).snapshot(true)).await?;
    Ok(rows
        .into_iter()
        .filter_map(|(key, _)| {
            let (at, t, id) = ks.parse_schedule_due(&key)?;
            Some((u64::try_from(at).ok()?, t, id))
        })
        .collect())
}

/// What a firing did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fired {
    /// The ids of the jobs it created.
    pub created: Vec<Vec<u8>>,
    /// Slots it did not run: missed (`catch_up`), the previous run still
    /// active (`overlap` false), or a job of that id exists.
    pub skipped: usize,
    /// The schedule had moved on (another node fired it) or is gone.
    pub stale: bool,
}

/// Fires the schedule whose due key said `due_at`, at `now`: creates the
/// jobs of the slots `catch_up` runs, and moves it to its first slot
/// after `now`.
pub async fn fire(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    id: &[u8],
    due_at: u64,
    now: u64,
) -> Result<Fired, StoreError> {
    let due_key = ks.schedule_due(as_i64(due_at), job_type, id);
    let Some(mut record) = read(tx, ks, job_type, id).await? else {
        // Its record is gone (or unreadable): so goes the due key, which
        // would wake every runner for nothing.
        tx.clear(&due_key);
        return Ok(Fired { stale: true, ..Fired::default() });
    };
    if record.next_run_at != due_at || due_at > now {
        return Ok(Fired { stale: true, ..Fired::default() });
    }
    let Ok(spec) = Spec::parse(&record.spec_json) else {
        tx.clear(&due_key);
        return Ok(Fired { stale: true, ..Fired::default() });
    };
    let due = spec.due(due_at, now);
    let run = spec.to_run(&due);
    let mut fired = Fired { skipped: due.slots.len() - run.len(), ..Fired::default() };
    for at in run {
        if !spec.overlap && previous_is_active(tx, ks, job_type, record.last_run.as_deref()).await? {
            fired.skipped += 1;
            continue;
        }
        let job = JobSpec { id: slot_job_id(id, at), info: record.info.clone(), opts: record.opts.clone() };
        match job_ops::add_job(tx, ks, job_type, &job, now).await? {
            Ok(()) => {
                record.last_run = Some(job.id.clone());
                fired.created.push(job.id);
            }
            // The slot's job exists (its id is the slot's), or cannot be
            // written (its key over the limit): the slot is over.
            Err(_) => fired.skipped += 1,
        }
    }
    tx.clear(&due_key);
    // No slot left (past year 9999): the record stays, listed with its
    // last slot, and no due key wakes anyone for it.
    if let Some(next) = spec.first_slot_from(now.saturating_add(1)) {
        record.next_run_at = next;
        tx.set(&ks.schedule_due(as_i64(next), job_type, id), b"");
    }
    tx.set(&ks.schedule(job_type, id), &record.encode());
    Ok(fired)
}

/// Whether the schedule's previous run is still scheduled, pending or
/// running.
async fn previous_is_active(tx: &Tx, ks: &Keyspace, job_type: &[u8], last: Option<&[u8]>) -> Result<bool, StoreError> {
    let Some(last) = last else { return Ok(false) };
    Ok(job_ops::get(tx, ks, job_type, last)
        .await?
        .is_some_and(|job| matches!(job.state, JobState::Scheduled | JobState::Pending | JobState::Running)))
}

fn as_i64(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}
