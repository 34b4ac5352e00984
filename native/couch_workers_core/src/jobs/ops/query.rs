//! The read side: one job, counts, job types, pages of jobs.

use super::helpers::{get_many, read_record};
use crate::jobs::history::{self, Run};
use crate::jobs::job::{Job, JobState};
use crate::jobs::place::{self, key_i64};
use crate::jobs::record::Record;
use crate::keyspace::Keyspace;
use crate::store::{RangeRequest, StoreError, Tx};

/// The job, if it exists, as this node's clock sees it.
pub async fn get(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8]) -> Result<Option<Job>, StoreError> {
    let now = place::wall_ms();
    Ok(read_record(tx, ks, job_type, id, false).await?.map(|rec| rec.to_job(job_type, id, now)))
}

/// [`get`] with the job's last runs, newest first (snapshot reads: no
/// conflict on a run written meanwhile).
pub async fn get_with_history(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    id: &[u8],
) -> Result<Option<(Job, Vec<Run>)>, StoreError> {
    let Some(rec) = read_record(tx, ks, job_type, id, false).await? else { return Ok(None) };
    let runs = history::read(tx, ks, job_type, id, &rec, true).await?;
    Ok(Some((rec.to_job(job_type, id, place::wall_ms()), runs)))
}

/// The ids of the type's scheduled jobs that are due by `now`: they count
/// and list as pending. Reads only their keys; the dispatchers (for the
/// types acceptors wait for) and every node's promoter (for all) keep
/// them few by moving due jobs to pending in the store, within about a
/// second of their `run_at` (`jobs::promoter`).
async fn due_scheduled(tx: &Tx, ks: &Keyspace, job_type: &[u8], now: u64) -> Result<Vec<Vec<u8>>, StoreError> {
    let (begin, _) = ks.scheduled_range(job_type);
    let end = ks.scheduled_after(job_type, key_i64(now));
    let rows = tx.get_range(&RangeRequest::new(begin, end).snapshot(true)).await?;
    Ok(rows.iter().filter_map(|(k, _)| ks.parse_scheduled(job_type, k)).map(|(_, id)| id).collect())
}

/// The earliest `run_at` of the type's scheduled jobs (one key read).
pub async fn next_run_at(tx: &Tx, ks: &Keyspace, job_type: &[u8]) -> Result<Option<u64>, StoreError> {
    let (begin, end) = ks.scheduled_range(job_type);
    let rows = tx.get_range(&RangeRequest::new(begin, end).limit(1).snapshot(true)).await?;
    Ok(rows.first().and_then(|(k, _)| ks.parse_scheduled(job_type, k)).map(|(at, _)| u64::try_from(at).unwrap_or(0)))
}

/// The exact number of jobs of a type that can be accepted now (pending,
/// and scheduled ones that are due): a counter and the due keys.
pub async fn pending_count(tx: &Tx, ks: &Keyspace, job_type: &[u8]) -> Result<u64, StoreError> {
    let raw = tx.get(&ks.pending_count(job_type), false).await?;
    Ok(place::read_counter(raw) + due_scheduled(tx, ks, job_type, place::wall_ms()).await?.len() as u64)
}

/// The exact number of the type's jobs in each state, in
/// [`JobState::ALL`]'s order: one counter per state, and due scheduled
/// jobs counted as pending.
pub async fn counts(tx: &Tx, ks: &Keyspace, job_type: &[u8]) -> Result<[u64; 6], StoreError> {
    let keys: Vec<Vec<u8>> = JobState::ALL.iter().map(|s| ks.state_count(job_type, s.name().as_bytes())).collect();
    let raw = get_many(tx, &keys, false).await?;
    let mut out = [0u64; 6];
    for (slot, raw) in out.iter_mut().zip(raw) {
        *slot = place::read_counter(raw);
    }
    let due = (due_scheduled(tx, ks, job_type, place::wall_ms()).await?.len() as u64).min(out[0]);
    out[0] -= due;
    out[1] += due;
    Ok(out)
}

/// The job types that have jobs: the per-type counts, never the jobs.
pub async fn job_types(tx: &Tx, ks: &Keyspace) -> Result<Vec<Vec<u8>>, StoreError> {
    let (begin, end) = ks.job_types_range();
    let rows = tx.get_range(&RangeRequest::new(begin, end).snapshot(true)).await?;
    Ok(rows
        .into_iter()
        .filter(|(_, v)| place::read_counter(Some(v.clone())) > 0)
        .filter_map(|(k, _)| ks.parse_job_type(&k))
        .collect())
}

/// One page of the type's jobs in id order, after `after` (exclusive):
/// every job, from the records, or only those in `states`, from each
/// state's index (a page reads at most `limit` keys per state asked for).
/// A job is listed in the state it reads as (`Record::to_job`): a
/// scheduled job that is due is pending, found through the due keys not
/// yet promoted (see `due_scheduled`), and not scheduled. The second
/// value is the id to continue after, `None` when no job follows.
pub async fn list(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    states: Option<&[JobState]>,
    limit: usize,
    after: Option<&[u8]>,
) -> Result<(Vec<Job>, Option<Vec<u8>>), StoreError> {
    let limit = limit.max(1);
    let now = place::wall_ms();
    let start = |begin: Vec<u8>, key: Option<Vec<u8>>| match key {
        Some(mut k) => {
            k.push(0);
            k.max(begin)
        }
        None => begin,
    };
    let Some(states) = states else {
        let (begin, end) = ks.jobs_range(job_type);
        let begin = start(begin, after.map(|a| ks.job(job_type, a)));
        let rows = tx.get_range(&RangeRequest::new(begin, end).limit(limit).snapshot(true)).await?;
        let mut jobs = Vec::with_capacity(rows.len());
        for (k, v) in &rows {
            let (Some(id), Ok(rec)) = (ks.parse_job(job_type, k), Record::decode(v)) else { continue };
            jobs.push(rec.to_job(job_type, &id, now));
        }
        let cont = (rows.len() == limit).then(|| rows.last().and_then(|(k, _)| ks.parse_job(job_type, k))).flatten();
        return Ok((jobs, cont));
    };
    let mut ids: Vec<Vec<u8>> = Vec::new();
    let mut maybe_more = false;
    for state in states {
        let name = state.name().as_bytes();
        let (begin, end) = ks.by_state_range(job_type, name);
        let begin = start(begin, after.map(|a| ks.by_state(job_type, name, a)));
        let rows = tx.get_range(&RangeRequest::new(begin, end).limit(limit).snapshot(true)).await?;
        maybe_more |= rows.len() == limit;
        ids.extend(rows.iter().filter_map(|(k, _)| ks.parse_by_state(job_type, name, k)));
        if *state == JobState::Pending {
            let due = due_scheduled(tx, ks, job_type, now).await?;
            ids.extend(due.into_iter().filter(|id| after.is_none_or(|a| id.as_slice() > a)));
        }
    }
    ids.sort();
    ids.dedup();
    maybe_more |= ids.len() > limit;
    ids.truncate(limit);
    let keys: Vec<Vec<u8>> = ids.iter().map(|id| ks.job(job_type, id)).collect();
    let values = get_many(tx, &keys, true).await?;
    let mut jobs = Vec::with_capacity(ids.len());
    for (id, v) in ids.iter().zip(values) {
        if let Some(rec) = v.and_then(|v| Record::decode(&v).ok()) {
            let job = rec.to_job(job_type, id, now);
            // A due job read through the scheduled index is pending now.
            if states.contains(&job.state) {
                jobs.push(job);
            }
        }
    }
    let cont = if maybe_more { ids.last().cloned() } else { None };
    Ok((jobs, cont))
}
