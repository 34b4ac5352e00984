//! The reads and checks that every operation shares: one record, many keys
//! in bounded batches, and the key and value limits a new job must fit.

use futures::future::try_join_all;

use crate::error::{check_key, Error};
use crate::jobs::job::{JobSpec, JobState};
use crate::jobs::place;
use crate::jobs::record::Record;
use crate::keyspace::Keyspace;
use crate::store::{StoreError, Tx, MAX_KEY_SIZE, MAX_VALUE_SIZE};

/// How many point reads are in flight at once (add_many, requeues).
const READ_CONCURRENCY: usize = 256;

pub(super) async fn read_record(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    id: &[u8],
    snapshot: bool,
) -> Result<Option<Record>, StoreError> {
    match tx.get(&ks.job(job_type, id), snapshot).await? {
        None => Ok(None),
        Some(value) => Record::decode(&value).map(Some),
    }
}

/// Reads the keys that are `Some`, in order; `None` where there is none.
pub(super) async fn get_some(
    tx: &Tx,
    keys: impl Iterator<Item = Option<Vec<u8>>>,
    snapshot: bool,
) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
    let keys: Vec<Option<Vec<u8>>> = keys.collect();
    let wanted: Vec<Vec<u8>> = keys.iter().flatten().cloned().collect();
    let mut found = get_many(tx, &wanted, snapshot).await?.into_iter();
    Ok(keys.iter().map(|k| k.as_ref().and_then(|_| found.next().flatten())).collect())
}

/// Reads many keys, a bounded number at a time, in order.
pub(super) async fn get_many(tx: &Tx, keys: &[Vec<u8>], snapshot: bool) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
    let mut out = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(READ_CONCURRENCY) {
        out.extend(try_join_all(chunk.iter().map(|k| tx.get(k, snapshot))).await?);
    }
    Ok(out)
}

pub(super) fn bump_pending(tx: &Tx, ks: &Keyspace, job_type: &[u8]) {
    place::bump_jobs_vs(tx, ks, job_type);
}

/// Checks the keys a new job will have and builds its record, queued as
/// its schedule says by `now` (so that the size checked is the size
/// written, its `queued_at` included).
pub(super) fn new_record(ks: &Keyspace, job_type: &[u8], job: &JobSpec, now: u64) -> Result<Record, Error> {
    check_index_keys(ks, job_type, &job.id, job.opts.priority.unwrap_or(0))?;
    let mut rec = Record::new(job.info.clone(), &job.opts);
    place::queue_state(&mut rec, job.opts.schedule, now);
    check_room_to_run(ks, job_type, &job.id, &rec)?;
    Ok(rec)
}

/// The longest worker id, in the bytes it adds to a tuple, that can hold
/// this job: its active key must fit the key limit (the accept round
/// gives the job to no worker whose key would not).
fn longest_worker(ks: &Keyspace, job_type: &[u8], id: &[u8]) -> usize {
    MAX_KEY_SIZE.saturating_sub(ks.active(job_type, b"", id).len())
}

/// Checks that a record that is or may again be queued fits the value
/// limit as it is and in the widest state it can reach without new data
/// ([`Record::largest_len`]) for the longest worker id that can hold it.
/// Otherwise its pending record would fit and its running one would not:
/// no accept could take it, and at the head of its queue it would stop
/// its type's accepts.
pub(super) fn check_room_to_run(ks: &Keyspace, job_type: &[u8], id: &[u8], rec: &Record) -> Result<(), Error> {
    let widest = rec.largest_len(longest_worker(ks, job_type, id));
    if rec.value_len().max(widest) > MAX_VALUE_SIZE {
        return Err(Error::Store(StoreError::ValueTooLarge));
    }
    Ok(())
}

/// Whether `worker` can hold the job `rec` runs now: its active key fits
/// the key limit and the record, running for it, the value limit. (Only
/// records written before [`check_room_to_run`] can fail the second.)
pub(super) fn can_hold(ks: &Keyspace, job_type: &[u8], id: &[u8], rec: &Record, worker: &[u8]) -> bool {
    ks.active(job_type, worker, id).len() <= MAX_KEY_SIZE && rec.running_len(worker) <= MAX_VALUE_SIZE
}

/// Checks the longest keys a job of this id may get (its record, its
/// pending key, its index and expiry keys) against the key limit.
pub(super) fn check_index_keys(ks: &Keyspace, job_type: &[u8], id: &[u8], priority: i64) -> Result<(), Error> {
    check_key(&ks.job(job_type, id))?;
    check_key(&ks.pending(job_type, priority, &[0; 12], id))?;
    check_key(&ks.by_state(job_type, JobState::Scheduled.name().as_bytes(), id))?;
    check_key(&ks.expiry(i64::MAX, job_type, id))?;
    check_key(&ks.scheduled(job_type, i64::MAX, id))
}

/// Checks the job key a call will read (a key over the limit is an error
/// on FoundationDB even for a read).
pub fn check_job_key(ks: &Keyspace, job_type: &[u8], id: &[u8]) -> Result<(), Error> {
    check_key(&ks.job(job_type, id))
}
