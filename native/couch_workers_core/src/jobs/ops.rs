//! The job queue's key-space operations, each run inside a transaction of
//! the caller's (the service's retry loop, `workers::remove`, the tests).
//!
//! Every function re-reads what it changes, so that a retried attempt
//! (conflict, commit-unknown) decides afresh. An expected outcome
//! (`not_found`, `already_exists`, `not_owner`, `canceled`) is a value,
//! `Ok(Err(Error))`: the transaction still commits (a `canceled` update
//! writes the cancellation); only store failures are `Err(StoreError)`.
//!
//! Invariants kept by every function here, in the same transaction as the
//! change that needs them:
//!
//! * a job is pending ⇔ it has exactly one pending key, whose VS equals
//!   its record's VS and whose priority equals its record's priority;
//! * the pending count is the number of pending keys: every set or clear
//!   of a pending key comes with `atomic_add(count, ±1)`;
//! * a job is running ⇔ its record names the worker and an accept token,
//!   and the active key `(WorkerType, Worker, JobId)` exists;
//! * whenever a job becomes pending, `jobs_vs` of its type is bumped (one
//!   bump per transaction), which wakes every node's dispatcher.
//!
//! Batches are bounded (FoundationDB's 10 MB / 5 s transaction limits
//! hold on every store): requeueing a worker's jobs handles at most
//! [`REQUEUE_MAX_JOBS`] jobs or [`BATCH_WRITE_BUDGET`] bytes per
//! transaction and leaves the rest to the sweeper behind an orphan marker;
//! an accept round stops at the same byte budget; `add_many` refuses a
//! batch that could not fit one transaction.

use std::collections::{HashMap, HashSet};

use futures::future::try_join_all;
use rand::RngCore;

use super::job::{AcceptToken, AddManyError, Fence, Job, JobHandle, JobState, JobVs, NewJob};
use super::record::{self, incomplete_vs, Record};
use crate::error::{check_key, Error};
use crate::keyspace::Keyspace;
use crate::store::{
    RangeRequest, StoreError, Tx, Watch, MAX_KEY_SIZE, MAX_TRANSACTION_SIZE, MAX_VALUE_SIZE,
};

/// An expected outcome of an operation (see the module comment).
pub type Outcome<T> = Result<T, Error>;

/// Most running jobs one transaction moves off a removed worker.
pub const REQUEUE_MAX_JOBS: usize = 500;

/// Most bytes (keys and values written) that one batch of requeues or
/// accepts may write: a fifth of FoundationDB's 10 MB, so that the
/// transaction that removes a worker has room for its own writes, and a
/// batch of big records stays far from the limit.
pub const BATCH_WRITE_BUDGET: usize = 2_000_000;

/// Most jobs in one `add_many`: each needs its own user version (a `u16`)
/// to keep first-in-first-out order within the commit.
pub const MAX_ADD_MANY: usize = 1 << 16;

/// How many point reads are in flight at once (add_many, requeues).
const READ_CONCURRENCY: usize = 256;

// ---- small helpers ------------------------------------------------------

async fn read_record(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8], snapshot: bool) -> Result<Option<Record>, StoreError> {
    match tx.get(&ks.job(job_type, id), snapshot).await? {
        None => Ok(None),
        Some(value) => Record::decode(&value).map(Some),
    }
}

/// Reads the keys that are `Some`, in order; `None` where there is none.
async fn get_some(tx: &Tx, keys: impl Iterator<Item = Option<Vec<u8>>>, snapshot: bool) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
    let keys: Vec<Option<Vec<u8>>> = keys.collect();
    let wanted: Vec<Vec<u8>> = keys.iter().flatten().cloned().collect();
    let mut found = get_many(tx, &wanted, snapshot).await?.into_iter();
    Ok(keys.iter().map(|k| k.as_ref().and_then(|_| found.next().flatten())).collect())
}

/// Reads many keys, a bounded number at a time, in order.
async fn get_many(tx: &Tx, keys: &[Vec<u8>], snapshot: bool) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
    let mut out = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(READ_CONCURRENCY) {
        out.extend(try_join_all(chunk.iter().map(|k| tx.get(k, snapshot))).await?);
    }
    Ok(out)
}

fn write_record(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8], rec: &mut Record, user_version: u16) {
    rec.vs = incomplete_vs(user_version);
    tx.set_versionstamped_value(&ks.job(job_type, id), &rec.encode(user_version));
}

/// Makes `rec` pending: a new pending key (same user version as the
/// record's VS), the record, count + 1. The caller bumps `jobs_vs`.
fn enqueue(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8], rec: &mut Record, user_version: u16) {
    rec.state = JobState::Pending;
    rec.worker = None;
    rec.token = None;
    rec.cancel_requested = false;
    tx.set_versionstamped_key(&ks.pending_new(job_type, rec.priority, user_version, id), b"");
    write_record(tx, ks, job_type, id, rec, user_version);
    tx.atomic_add(&ks.pending_count(job_type), 1);
}

/// Clears the pending key of a pending `rec`, count − 1.
fn dequeue(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8], rec: &Record) {
    tx.clear(&ks.pending(job_type, rec.priority, &rec.vs, id));
    tx.atomic_add(&ks.pending_count(job_type), -1);
}

fn bump_pending(tx: &Tx, ks: &Keyspace, job_type: &[u8]) {
    tx.set_versionstamped_value(&ks.jobs_vs(job_type), &Keyspace::vs_placeholder_value());
}

fn new_token() -> AcceptToken {
    let mut token = [0u8; 16];
    rand::rng().fill_bytes(&mut token);
    token
}

/// One fresh accept token per waiter of an accept round. Drawn *outside*
/// the retry loop, so that every attempt of the round uses the same ones
/// (see [`Acceptors::recheck`]).
pub fn new_tokens(n: usize) -> Vec<AcceptToken> {
    (0..n).map(|_| new_token()).collect()
}

/// Most running jobs of one worker a retried round reads back looking for
/// its own accepts (see [`Acceptors::recheck`]).
pub const RECHECK_MAX_JOBS: usize = 1_000;

/// The waiters of one accept round.
#[derive(Debug, Clone, Copy)]
pub struct Acceptors<'a> {
    /// The worker id each waiter accepts for (several may name one worker).
    pub workers: &'a [Vec<u8>],
    /// The token each waiter's accept gets ([`new_tokens`]), the same on
    /// every attempt of the round.
    pub tokens: &'a [AcceptToken],
    /// This attempt follows a failed one. An attempt that failed with
    /// `commit_unknown_result` may have committed (FoundationDB says so):
    /// its jobs are then running for the waiters, and taking others would
    /// leave those running for a worker that never heard of them (until it
    /// goes). So a retried round first looks for jobs its waiters' workers
    /// run under its tokens and hands those out again.
    pub recheck: bool,
}

/// A running job leaves its worker for `state` (finished, canceled): the
/// active key goes, and with it the worker and the token.
fn leave(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8], rec: &mut Record, state: JobState) {
    if let Some(worker) = rec.worker.take() {
        tx.clear(&ks.active(job_type, &worker, id));
    }
    rec.state = state;
    rec.token = None;
    rec.cancel_requested = false;
    write_record(tx, ks, job_type, id, rec, 0);
}

/// A running job whose worker is gone: back to pending, or canceled if a
/// cancel was requested while it ran (nobody is left to see the request,
/// and running it again would ignore it). Attempts are kept: they count
/// accepts. The caller clears the active key and bumps `jobs_vs` when this
/// returns true (the job became pending).
fn requeue_running(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8], rec: &mut Record, user_version: u16) -> bool {
    if rec.cancel_requested {
        rec.state = JobState::Canceled;
        rec.worker = None;
        rec.token = None;
        rec.cancel_requested = false;
        write_record(tx, ks, job_type, id, rec, user_version);
        false
    } else {
        enqueue(tx, ks, job_type, id, rec, user_version);
        true
    }
}

/// Checks the keys a new job will have and builds its record.
fn new_record(ks: &Keyspace, job_type: &[u8], job: &NewJob) -> Result<Record, Error> {
    check_key(&ks.job(job_type, &job.id))?;
    check_key(&ks.pending(job_type, job.priority, &[0; 12], &job.id))?;
    let rec = Record::new_pending(job.priority, job.info.clone());
    if rec.stored_len() > MAX_VALUE_SIZE {
        return Err(Error::Store(StoreError::ValueTooLarge));
    }
    Ok(rec)
}

/// Checks the job key a call will read (a key over the limit is an error
/// on FoundationDB even for a read).
pub fn check_job_key(ks: &Keyspace, job_type: &[u8], id: &[u8]) -> Result<(), Error> {
    check_key(&ks.job(job_type, id))
}

// ---- add ------------------------------------------------------------------

/// Adds a pending job. `AlreadyExists` if a job of that type and id exists
/// in any state.
pub async fn add(tx: &Tx, ks: &Keyspace, job_type: &[u8], job: &NewJob) -> Result<Outcome<()>, StoreError> {
    let mut rec = match new_record(ks, job_type, job) {
        Ok(rec) => rec,
        Err(e) => return Ok(Err(e)),
    };
    if tx.get(&ks.job(job_type, &job.id), false).await?.is_some() {
        return Ok(Err(Error::AlreadyExists));
    }
    enqueue(tx, ks, job_type, &job.id, &mut rec, 0);
    bump_pending(tx, ks, job_type);
    Ok(Ok(()))
}

/// Adds every job or none: `AlreadyExists(ids)` names the ids that exist
/// (or repeat within the batch). A batch that one transaction cannot hold
/// (over [`MAX_ADD_MANY`] jobs, or an estimated write size over
/// FoundationDB's 10 MB) is refused whole with `transaction_too_large`:
/// splitting it would break the all-or-nothing contract.
pub async fn add_many(tx: &Tx, ks: &Keyspace, job_type: &[u8], jobs: &[NewJob]) -> Result<Result<(), AddManyError>, StoreError> {
    if jobs.is_empty() {
        return Ok(Ok(()));
    }
    if jobs.len() > MAX_ADD_MANY {
        return Ok(Err(Error::Store(StoreError::TransactionTooLarge).into()));
    }
    let mut records = Vec::with_capacity(jobs.len());
    let mut size = 0usize;
    for job in jobs {
        let rec = match new_record(ks, job_type, job) {
            Ok(rec) => rec,
            Err(e) => return Ok(Err(e.into())),
        };
        let job_key = ks.job(job_type, &job.id).len();
        // The record and pending key written, and the read conflict range
        // of the existence check (about twice the key).
        size += rec.stored_len() + 3 * job_key + ks.pending(job_type, job.priority, &[0; 12], &job.id).len();
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
    for (i, (job, rec)) in jobs.iter().zip(records.iter_mut()).enumerate() {
        // i < MAX_ADD_MANY = 2^16, checked above.
        enqueue(tx, ks, job_type, &job.id, rec, i as u16);
    }
    bump_pending(tx, ks, job_type);
    Ok(Ok(()))
}

// ---- accept -----------------------------------------------------------

/// What one waiter got from an accept round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Take {
    /// A job, now running for the waiter's worker. Its `vs` is incomplete
    /// until the commit (the service fills it in).
    Job(JobHandle),
    /// The worker is registered but no job was left for it this round.
    NoJob,
    /// The worker is not registered (no member key): `not_found`.
    NotRegistered,
}

/// The outcome of [`accept`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptRound {
    /// One per waiter, in the order given.
    pub takes: Vec<Take>,
    /// Waiters were left without a job while more pending jobs may exist
    /// (the byte budget ran out, or stale pending keys were cleared): run
    /// another round rather than wait for a watch.
    pub more: bool,
}

/// Takes up to one pending job for each waiter (a waiter is the worker id
/// it accepts for; several waiters may name the same worker), in queue
/// order: lowest priority first, first in first out within a priority,
/// the first waiter getting the first job.
///
/// The pending range is read as a snapshot and only the taken jobs' keys
/// get read conflicts, so that concurrent adds do not conflict with it,
/// while two rounds (on any nodes) that pick the same job do: one of them
/// retries and takes the next jobs. Each worker's member key is read
/// without snapshot, so a concurrent removal of the worker either sees the
/// new active keys (and requeues them) or makes this round retry and find
/// the worker gone.
pub async fn accept(tx: &Tx, ks: &Keyspace, worker_type: &[u8], acceptors: Acceptors<'_>) -> Result<AcceptRound, StoreError> {
    let Acceptors { workers: waiters, tokens, recheck } = acceptors;
    if tokens.len() != waiters.len() {
        return Err(StoreError::Invalid("accept: one token per waiter".into()));
    }
    let mut takes = vec![Take::NoJob; waiters.len()];
    if waiters.is_empty() {
        return Ok(AcceptRound { takes, more: false });
    }
    // Which workers are registered (each distinct worker read once).
    let distinct: Vec<&[u8]> = {
        let mut seen = HashSet::new();
        waiters.iter().map(Vec::as_slice).filter(|w| seen.insert(*w)).collect()
    };
    let member_keys: Vec<Vec<u8>> = distinct.iter().map(|w| ks.member(worker_type, w)).collect();
    let members = get_many(tx, &member_keys, false).await?;
    let registered: HashMap<&[u8], bool> =
        distinct.iter().copied().zip(members.iter().map(Option::is_some)).collect();
    let mut queue: Vec<usize> = Vec::with_capacity(waiters.len());
    for (i, w) in waiters.iter().enumerate() {
        if registered.get(w.as_slice()).copied().unwrap_or(false) {
            queue.push(i);
        } else {
            takes[i] = Take::NotRegistered;
        }
    }
    if recheck {
        let found = taken_before(tx, ks, worker_type, waiters, tokens, &queue).await?;
        queue.retain(|&i| !found.iter().any(|(w, _)| *w == i));
        for (i, handle) in found {
            takes[i] = Take::Job(handle);
        }
    }
    if queue.is_empty() {
        return Ok(AcceptRound { takes, more: false });
    }

    let (begin, end) = ks.pending_range(worker_type);
    let rows = tx.get_range(&RangeRequest::new(begin, end).limit(queue.len()).snapshot(true)).await?;
    let full = rows.len() == queue.len();
    let parsed: Vec<Option<(i64, JobVs, Vec<u8>)>> = rows.iter().map(|(k, _)| ks.parse_pending(worker_type, k)).collect();
    let values = get_some(tx, parsed.iter().map(|p| p.as_ref().map(|(_, _, id)| ks.job(worker_type, id))), true).await?;

    let mut next = 0usize; // index into `queue`
    let mut progress = false;
    let mut budget_left = true;
    let mut written = 0usize;
    let mut user_version: u16 = 0;
    for (((pending_key, _), parsed), value) in rows.iter().zip(parsed).zip(values) {
        if next == queue.len() {
            break;
        }
        let Some((priority, vs, id)) = parsed else {
            // Not a key this code writes: clear it, or it would sit at the
            // head of the queue forever.
            tx.add_read_conflict_key(pending_key);
            tx.clear(pending_key);
            progress = true;
            continue;
        };
        let rec = match value.map(|v| Record::decode(&v)).transpose() {
            Ok(Some(rec)) if rec.state == JobState::Pending && rec.vs == vs && rec.priority == priority => rec,
            _ => {
                // A stale pending key (its record is gone, changed or
                // unreadable): drop it with its count.
                tx.add_read_conflict_key(pending_key);
                tx.clear(pending_key);
                tx.atomic_add(&ks.pending_count(worker_type), -1);
                progress = true;
                continue;
            }
        };
        // The first waiter (FIFO) whose active key fits the key limit; a
        // job no waiter here can hold stays pending for other workers.
        let Some(pos) = queue[next..]
            .iter()
            .position(|&i| ks.active(worker_type, &waiters[i], &id).len() <= MAX_KEY_SIZE)
        else {
            continue;
        };
        let active_len = ks.active(worker_type, &waiters[queue[next + pos]], &id).len();
        let cost = rec.stored_len() + 2 * ks.job(worker_type, &id).len() + 2 * pending_key.len() + active_len;
        if written > 0 && written + cost > BATCH_WRITE_BUDGET {
            budget_left = false;
            break;
        }
        written += cost;
        queue[next..].swap(0, pos);
        let waiter = queue[next];
        next += 1;
        let worker = &waiters[waiter];

        tx.add_read_conflict_key(pending_key);
        tx.add_read_conflict_key(&ks.job(worker_type, &id));
        let mut rec = rec;
        dequeue(tx, ks, worker_type, &id, &rec);
        let token = tokens[waiter];
        rec.state = JobState::Running;
        rec.worker = Some(worker.clone());
        rec.token = Some(token);
        rec.cancel_requested = false;
        rec.attempts += 1;
        write_record(tx, ks, worker_type, &id, &mut rec, user_version);
        tx.set_versionstamped_value(&ks.active(worker_type, worker, &id), &record::encode_active(user_version));
        user_version = user_version.wrapping_add(1);
        progress = true;
        takes[waiter] = Take::Job(JobHandle { job: rec.to_job(worker_type, &id), token });
    }
    let waiting = next < queue.len();
    let more = waiting && (!budget_left || (full && progress));
    Ok(AcceptRound { takes, more })
}

/// The jobs that the waiters in `queue` already hold under their tokens:
/// running for the waiter's worker with the waiter's token (an earlier
/// attempt of this round committed them). (waiter index, handle).
async fn taken_before(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    waiters: &[Vec<u8>],
    tokens: &[AcceptToken],
    queue: &[usize],
) -> Result<Vec<(usize, JobHandle)>, StoreError> {
    let mut found = Vec::new();
    let mut seen = HashSet::new();
    for &i in queue {
        let worker = &waiters[i];
        if !seen.insert(worker.as_slice()) {
            continue;
        }
        // The worker's running jobs and their records as snapshots (no
        // conflicts with the worker's own updates and finishes of other
        // jobs); a job handed out again gets a read conflict below, since
        // it must still be the worker's when this commits.
        let (begin, end) = ks.active_range(worker_type, worker);
        let rows = tx.get_range(&RangeRequest::new(begin, end).limit(RECHECK_MAX_JOBS).snapshot(true)).await?;
        let ids: Vec<Option<Vec<u8>>> = rows.iter().map(|(k, _)| ks.parse_active_job_id(worker_type, worker, k)).collect();
        let values = get_some(tx, ids.iter().map(|id| id.as_ref().map(|id| ks.job(worker_type, id))), true).await?;
        for (id, value) in ids.iter().zip(values) {
            let (Some(id), Some(value)) = (id, value) else { continue };
            let Ok(rec) = Record::decode(&value) else { continue };
            if rec.state != JobState::Running || rec.worker.as_deref() != Some(worker.as_slice()) {
                continue;
            }
            let Some(token) = rec.token else { continue };
            let mine = queue.iter().find(|&&j| waiters[j] == *worker && tokens[j] == token && !found.iter().any(|(f, _)| *f == j));
            if let Some(&j) = mine {
                tx.add_read_conflict_key(&ks.job(worker_type, id));
                found.push((j, JobHandle { job: rec.to_job(worker_type, id), token }));
            }
        }
    }
    Ok(found)
}

/// Reads the type's `jobs_vs` and returns a watch on it, armed when this
/// transaction commits: a job that becomes pending after this
/// transaction's reads fires it.
pub async fn pending_watch(tx: &Tx, ks: &Keyspace, job_type: &[u8]) -> Result<Watch, StoreError> {
    let key = ks.jobs_vs(job_type);
    tx.get(&key, true).await?;
    Ok(tx.watch(&key))
}

/// Undoes a delivery that failed (the acceptor went away after the
/// transaction that took the job): the job goes back to pending exactly as
/// on failover, if the accept of `fence` still holds it. Returns whether it
/// did.
pub async fn release(tx: &Tx, ks: &Keyspace, fence: &Fence) -> Result<bool, StoreError> {
    let Some(mut rec) = read_record(tx, ks, &fence.job_type, &fence.job_id, false).await? else {
        return Ok(false);
    };
    if rec.state != JobState::Running || rec.token != Some(fence.token) {
        return Ok(false);
    }
    tx.clear(&ks.active(&fence.job_type, &fence.worker, &fence.job_id));
    if requeue_running(tx, ks, &fence.job_type, &fence.job_id, &mut rec, 0) {
        bump_pending(tx, ks, &fence.job_type);
    }
    Ok(true)
}

// ---- the worker's side: update, finish --------------------------------

/// The record of the job `fence` names, if that accept still holds it:
/// running, same worker, same token, and not a job of a removed
/// incarnation of the worker that the sweeper has not reached yet.
async fn owned_record(tx: &Tx, ks: &Keyspace, fence: &Fence) -> Result<Outcome<Record>, StoreError> {
    let Some(rec) = read_record(tx, ks, &fence.job_type, &fence.job_id, false).await? else {
        return Ok(Err(Error::NotFound));
    };
    if rec.state != JobState::Running || rec.token != Some(fence.token) || rec.worker.as_deref() != Some(&fence.worker[..]) {
        return Ok(Err(Error::NotOwner));
    }
    if let Some(marker) = tx.get(&ks.orphan(&fence.job_type, &fence.worker), false).await? {
        let accepted = tx.get(&ks.active(&fence.job_type, &fence.worker, &fence.job_id), false).await?;
        let accepted = accepted.and_then(|v| record::decode_active(&v));
        if let (Some(removed), Some(accepted)) = (record::decode_orphan_marker(&marker), accepted) {
            if accepted[..10] < removed[..10] {
                return Ok(Err(Error::NotOwner));
            }
        }
    }
    Ok(Ok(rec))
}

/// Replaces the info of a job the handle holds. If a cancel was requested
/// the job becomes canceled instead (and leaves the worker): `Canceled`.
pub async fn update(tx: &Tx, ks: &Keyspace, fence: &Fence, info: &[u8]) -> Result<Outcome<JobHandle>, StoreError> {
    if let Err(e) = check_job_key(ks, &fence.job_type, &fence.job_id) {
        return Ok(Err(e));
    }
    let mut rec = match owned_record(tx, ks, fence).await? {
        Ok(rec) => rec,
        Err(e) => return Ok(Err(e)),
    };
    if rec.cancel_requested {
        leave(tx, ks, &fence.job_type, &fence.job_id, &mut rec, JobState::Canceled);
        return Ok(Err(Error::Canceled));
    }
    rec.info = info.to_vec();
    if rec.stored_len() > MAX_VALUE_SIZE {
        return Ok(Err(Error::Store(StoreError::ValueTooLarge)));
    }
    write_record(tx, ks, &fence.job_type, &fence.job_id, &mut rec, 0);
    Ok(Ok(JobHandle { job: rec.to_job(&fence.job_type, &fence.job_id), token: fence.token }))
}

/// Finishes a job the handle holds (also one with a cancel request).
pub async fn finish(tx: &Tx, ks: &Keyspace, fence: &Fence, result: &[u8]) -> Result<Outcome<Job>, StoreError> {
    if let Err(e) = check_job_key(ks, &fence.job_type, &fence.job_id) {
        return Ok(Err(e));
    }
    let mut rec = match owned_record(tx, ks, fence).await? {
        Ok(rec) => rec,
        Err(e) => return Ok(Err(e)),
    };
    rec.result = Some(result.to_vec());
    if rec.stored_len() > MAX_VALUE_SIZE {
        return Ok(Err(Error::Store(StoreError::ValueTooLarge)));
    }
    leave(tx, ks, &fence.job_type, &fence.job_id, &mut rec, JobState::Finished);
    Ok(Ok(rec.to_job(&fence.job_type, &fence.job_id)))
}

// ---- anyone's side: cancel, remove, get, count ---------------------------

/// Cancels a job: a pending one at once, a running one by request (its
/// worker's next update cancels it), a finished or canceled one not at all
/// (`Ok`, nothing written). Returns the job as it now is.
pub async fn cancel(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8]) -> Result<Outcome<Job>, StoreError> {
    if let Err(e) = check_job_key(ks, job_type, id) {
        return Ok(Err(e));
    }
    let Some(mut rec) = read_record(tx, ks, job_type, id, false).await? else {
        return Ok(Err(Error::NotFound));
    };
    match rec.state {
        JobState::Pending => {
            dequeue(tx, ks, job_type, id, &rec);
            rec.state = JobState::Canceled;
            write_record(tx, ks, job_type, id, &mut rec, 0);
        }
        JobState::Running if !rec.cancel_requested => {
            rec.cancel_requested = true;
            write_record(tx, ks, job_type, id, &mut rec, 0);
        }
        _ => {}
    }
    Ok(Ok(rec.to_job(job_type, id)))
}

/// Removes a job in any state; a running one's worker is then refused
/// (`not_found`).
pub async fn remove(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8]) -> Result<Outcome<()>, StoreError> {
    if let Err(e) = check_job_key(ks, job_type, id) {
        return Ok(Err(e));
    }
    let Some(rec) = read_record(tx, ks, job_type, id, false).await? else {
        return Ok(Err(Error::NotFound));
    };
    match (rec.state, &rec.worker) {
        (JobState::Pending, _) => dequeue(tx, ks, job_type, id, &rec),
        (JobState::Running, Some(worker)) => tx.clear(&ks.active(job_type, worker, id)),
        _ => {}
    }
    tx.clear(&ks.job(job_type, id));
    Ok(Ok(()))
}

/// The job, if it exists.
pub async fn get(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8]) -> Result<Option<Job>, StoreError> {
    Ok(read_record(tx, ks, job_type, id, false).await?.map(|rec| rec.to_job(job_type, id)))
}

/// The exact number of pending jobs of a type (the counter, O(1)).
pub async fn pending_count(tx: &Tx, ks: &Keyspace, job_type: &[u8]) -> Result<u64, StoreError> {
    let raw = tx.get(&ks.pending_count(job_type), false).await?;
    let mut le = [0u8; 8];
    if let Some(raw) = raw {
        let n = raw.len().min(8);
        le[..n].copy_from_slice(&raw[..n]);
    }
    Ok(u64::try_from(i64::from_le_bytes(le)).unwrap_or(0))
}

// ---- failover: requeue a removed worker's jobs ----------------------------

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

/// Requeues the jobs of `rows` (active key-value pairs of one worker, in
/// key order), within the byte budget. With `older_than`, only jobs
/// accepted before that versionstamp are moved (the others belong to a
/// later incarnation of the worker and are skipped).
async fn requeue_rows(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    worker: &[u8],
    rows: &[(Vec<u8>, Vec<u8>)],
    older_than: Option<&JobVs>,
) -> Result<Batch, StoreError> {
    let ids: Vec<Option<Vec<u8>>> = rows
        .iter()
        .map(|(key, value)| {
            let id = ks.parse_active_job_id(worker_type, worker, key)?;
            let old = match (older_than, record::decode_active(value)) {
                (Some(removed), Some(accepted)) => accepted[..10] < removed[..10],
                _ => true,
            };
            old.then_some(id)
        })
        .collect();
    let values = get_some(tx, ids.iter().map(|id| id.as_ref().map(|id| ks.job(worker_type, id))), false).await?;

    let mut batch = Batch::default();
    let mut written = 0usize;
    let mut any_pending = false;
    let mut user_version: u16 = 0;
    for (i, (active_key, _)) in rows.iter().enumerate() {
        let Some(id) = &ids[i] else {
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
                let cost = rec.stored_len()
                    + 2 * ks.job(worker_type, id).len()
                    + 2 * active_key.len()
                    + ks.pending(worker_type, rec.priority, &[0; 12], id).len();
                if written > 0 && written + cost > BATCH_WRITE_BUDGET {
                    batch.stopped = true;
                    break;
                }
                written += cost;
                tx.clear(active_key);
                any_pending |= requeue_running(tx, ks, worker_type, id, &mut rec, user_version);
                user_version = user_version.wrapping_add(1);
                batch.moved += 1;
            }
            // The record no longer says this worker runs it: a stale key.
            _ => tx.clear(active_key),
        }
        batch.consumed += 1;
    }
    if any_pending {
        bump_pending(tx, ks, worker_type);
    }
    Ok(batch)
}

/// Sends the jobs that `worker` of `worker_type` is running back to
/// pending (or to canceled, when a cancel was requested), in the caller's
/// transaction (the one that removes or re-registers the worker). Returns
/// how many it moved.
///
/// At most [`REQUEUE_MAX_JOBS`] jobs and [`BATCH_WRITE_BUDGET`] bytes move
/// in this transaction. If more remain, it writes the orphan marker
/// `("couch_workers", "orphans", WorkerType, Worker) = (RemovalVS,)` and
/// bumps `orphans_vs`: every node's sweeper wakes and moves the rest, in
/// transactions of the same bounds (see [`sweep_orphan`]). Until then the
/// handles of those jobs are refused all the same: `update`/`finish` see
/// the marker and compare it with the job's accept VS.
pub async fn requeue_worker_jobs(tx: &Tx, ks: &Keyspace, worker_type: &[u8], worker: &[u8]) -> Result<usize, StoreError> {
    let (begin, end) = ks.active_range(worker_type, worker);
    let rows = tx.get_range(&RangeRequest::new(begin, end).limit(REQUEUE_MAX_JOBS + 1)).await?;
    let take = rows.len().min(REQUEUE_MAX_JOBS);
    let batch = requeue_rows(tx, ks, worker_type, worker, &rows[..take], None).await?;
    if batch.consumed < rows.len() {
        tx.set_versionstamped_value(&ks.orphan(worker_type, worker), &record::encode_orphan_marker());
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
/// accepted before the marker's removal VS: jobs a re-registered
/// incarnation took since are left alone), and clears the marker once its
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
    let Some(marker) = record::decode_orphan_marker(&value) else {
        // Not a marker this code wrote: drop it rather than guess.
        tx.clear(&orphan_key);
        return Ok(SweepStep::Done { moved: 0 });
    };
    let (mut begin, end) = ks.active_range(worker_type, worker);
    if let Some(c) = cursor.filter(|c| c.marker == marker) {
        begin = c.after.clone();
        begin.push(0);
    }
    let rows = tx.get_range(&RangeRequest::new(begin, end).limit(REQUEUE_MAX_JOBS)).await?;
    let batch = requeue_rows(tx, ks, worker_type, worker, &rows, Some(&marker)).await?;
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
