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

use super::job::{AcceptToken, AddManyError, Fence, Job, JobHandle, JobOpts, JobSpec, JobState, JobVs, NewJob, Schedule};
use super::place::{self, earliest_scheduled, key_i64, place, queue_state, unplace, write_record, Queued};
use super::record::{self, Record, Resubmit};
use crate::error::{check_key, Error};
use crate::keyspace::{Incarnation, Keyspace};
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

fn bump_pending(tx: &Tx, ks: &Keyspace, job_type: &[u8]) {
    place::bump_jobs_vs(tx, ks, job_type);
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
    /// The registration each waiter accepts for: one per waiter, or none
    /// at all (empty: every waiter accepts for whichever registration
    /// holds its worker id). A waiter whose incarnation no longer holds
    /// the id (its registration ended; the id may be registered again)
    /// is `NotRegistered` and takes nothing of the next registration's.
    pub incarnations: &'a [Option<Incarnation>],
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

/// Ends the run of the running `rec`: it leaves its worker (active key,
/// token) and goes where `end` says, in the caller's transaction. A
/// resubmission made while it ran wins over everything but a cancel. A
/// cancel request wins over a retry or release (nobody would see it
/// otherwise). Returns what it queued.
#[allow(clippy::too_many_arguments)]
pub(crate) fn end_run(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8], rec: &mut Record, end: RunEnd, user_version: u16, now: u64) -> Queued {
    unplace(tx, ks, job_type, id, rec);
    let resubmit = rec.resubmit.take();
    let cancel = rec.cancel_requested;
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
        RunEnd::Lost => {
            rec.error = Some(place::worker_lost_error());
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
    if rec.state != JobState::Canceled {
        if let Some(r) = resubmit {
            apply_resubmit(rec, r, now);
        }
    }
    place(tx, ks, job_type, id, rec, user_version, now);
    let mut queued = Queued::default();
    queued.note(rec);
    queued
}

/// Queues `rec` again as `resubmit` says: its info, its options over the
/// job's, attempts 0, no error (a result is kept).
fn apply_resubmit(rec: &mut Record, r: Resubmit, now: u64) {
    rec.info = r.info;
    apply_opts(rec, &r.opts);
    rec.attempts = 0;
    rec.error = None;
    queue_state(rec, r.opts.schedule, now);
}

/// The options given replace the job's; the others keep their values.
fn apply_opts(rec: &mut Record, opts: &JobOpts) {
    if let Some(p) = opts.priority {
        rec.priority = p;
    }
    if let Some(m) = opts.max_attempts {
        rec.max_attempts = m;
    }
    if let Some(k) = opts.keep {
        rec.keep = k;
    }
}

/// Checks the keys a new job will have and builds its record.
fn new_record(ks: &Keyspace, job_type: &[u8], job: &JobSpec) -> Result<Record, Error> {
    check_index_keys(ks, job_type, &job.id, job.opts.priority.unwrap_or(0))?;
    let rec = Record::new(job.info.clone(), &job.opts);
    if rec.stored_len() > MAX_VALUE_SIZE {
        return Err(Error::Store(StoreError::ValueTooLarge));
    }
    Ok(rec)
}

/// Checks the longest keys a job of this id may get (its record, its
/// pending key, its index and expiry keys) against the key limit.
fn check_index_keys(ks: &Keyspace, job_type: &[u8], id: &[u8], priority: i64) -> Result<(), Error> {
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

// ---- add ------------------------------------------------------------------

/// Adds a pending job. `AlreadyExists` if a job of that type and id exists
/// in any state.
pub async fn add(tx: &Tx, ks: &Keyspace, job_type: &[u8], job: &NewJob) -> Result<Outcome<()>, StoreError> {
    add_job(tx, ks, job_type, &JobSpec::from(job), place::wall_ms()).await
}

/// Adds a job with its options: `scheduled` if its schedule is in the
/// future of `now`, else pending. `AlreadyExists` if a job of that type and
/// id exists in any state.
pub async fn add_job(tx: &Tx, ks: &Keyspace, job_type: &[u8], job: &JobSpec, now: u64) -> Result<Outcome<()>, StoreError> {
    let mut rec = match new_record(ks, job_type, job) {
        Ok(rec) => rec,
        Err(e) => return Ok(Err(e)),
    };
    if tx.get(&ks.job(job_type, &job.id), false).await?.is_some() {
        return Ok(Err(Error::AlreadyExists));
    }
    let before = if job.opts.schedule.is_some() { earliest_scheduled(tx, ks, job_type).await? } else { None };
    let mut queued = Queued::default();
    insert(tx, ks, job_type, &job.id, &mut rec, job.opts.schedule, 0, now, &mut queued);
    queued.wake(tx, ks, job_type, before);
    Ok(Ok(()))
}

/// Writes a new job: queued as its schedule says, counted in its type.
#[allow(clippy::too_many_arguments)]
fn insert(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8], rec: &mut Record, schedule: Option<Schedule>, user_version: u16, now: u64, queued: &mut Queued) {
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
pub async fn add_many(tx: &Tx, ks: &Keyspace, job_type: &[u8], jobs: &[NewJob]) -> Result<Result<(), AddManyError>, StoreError> {
    let specs: Vec<JobSpec> = jobs.iter().map(JobSpec::from).collect();
    add_many_jobs(tx, ks, job_type, &specs, place::wall_ms()).await
}

/// [`add_many`] with every job's options.
pub async fn add_many_jobs(tx: &Tx, ks: &Keyspace, job_type: &[u8], jobs: &[JobSpec], now: u64) -> Result<Result<(), AddManyError>, StoreError> {
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
        // The record, its pending or scheduled key and its index key.
        size += rec.stored_len() + 5 * job_key + ks.pending(job_type, rec.priority, &[0; 12], &job.id).len();
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
    let before = if jobs.iter().any(|j| j.opts.schedule.is_some()) { earliest_scheduled(tx, ks, job_type).await? } else { None };
    let mut queued = Queued::default();
    for (i, (job, rec)) in jobs.iter().zip(records.iter_mut()).enumerate() {
        // i < MAX_ADD_MANY = 2^16, checked above.
        insert(tx, ks, job_type, &job.id, rec, job.opts.schedule, i as u16, now, &mut queued);
    }
    queued.wake(tx, ks, job_type, before);
    Ok(Ok(()))
}

// ---- accept -----------------------------------------------------------

/// A job an accept round may take: a pending key, or (`due`) the
/// scheduled key of a job due now.
struct Candidate {
    key: Vec<u8>,
    /// The scheduled key's `run_at`, for a due scheduled job.
    due: Option<i64>,
    /// The pending key's priority, VS and id (for a due job: its id).
    parsed: Option<(i64, JobVs, Vec<u8>)>,
    value: Option<Vec<u8>>,
}

/// What one waiter got from an accept round (most waiters get a job).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Take {
    /// A job, now running for the waiter's worker. Its `vs` is incomplete
    /// until the commit (the service fills it in).
    Job(JobHandle),
    /// The worker is registered but no job was left for it this round.
    NoJob,
    /// The worker is not registered (no member key), or not by the
    /// incarnation the waiter accepts for: `not_found`.
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
    /// The earliest `run_at` of the type's scheduled jobs, as this round
    /// saw it: the dispatcher's timer. A time not after now means jobs are
    /// due: [`promote_due`] moves them, then another round takes them.
    pub next_due: Option<u64>,
    /// The type is paused: nothing was taken.
    pub paused: bool,
}

/// Takes up to one pending job for each waiter (a waiter is the worker id
/// it accepts for; several waiters may name the same worker), in queue
/// order: lowest priority first, first in first out within a priority,
/// the first waiter getting the first job. A waiter that names an
/// incarnation takes a job only while that incarnation holds the id.
///
/// The pending range is read as a snapshot and only the taken jobs' keys
/// get read conflicts, so that concurrent adds do not conflict with it,
/// while two rounds (on any nodes) that pick the same job do: one of them
/// retries and takes the next jobs. Each worker's member key is read
/// without snapshot, so a concurrent removal of the worker either sees the
/// new active keys (and requeues them) or makes this round retry and find
/// the worker gone.
pub async fn accept(tx: &Tx, ks: &Keyspace, worker_type: &[u8], acceptors: Acceptors<'_>) -> Result<AcceptRound, StoreError> {
    let now = place::wall_ms();
    let Acceptors { workers: waiters, incarnations, tokens, recheck } = acceptors;
    if tokens.len() != waiters.len() {
        return Err(StoreError::Invalid("accept: one token per waiter".into()));
    }
    if !incarnations.is_empty() && incarnations.len() != waiters.len() {
        return Err(StoreError::Invalid("accept: one incarnation per waiter, or none".into()));
    }
    let mut takes = vec![Take::NoJob; waiters.len()];
    if waiters.is_empty() {
        return Ok(AcceptRound { takes, more: false, next_due: None, paused: false });
    }
    // Not a snapshot: a pause that commits while this round runs makes it
    // retry, and the retry sees the pause.
    let paused = tx.get(&ks.paused(worker_type), false).await?.is_some();
    let next_due = earliest_scheduled(tx, ks, worker_type).await?;
    // Which workers are registered (each distinct worker read once).
    let distinct: Vec<&[u8]> = {
        let mut seen = HashSet::new();
        waiters.iter().map(Vec::as_slice).filter(|w| seen.insert(*w)).collect()
    };
    let member_keys: Vec<Vec<u8>> = distinct.iter().map(|w| ks.member(worker_type, w)).collect();
    let members = get_many(tx, &member_keys, false).await?;
    let registered: HashMap<&[u8], bool> =
        distinct.iter().copied().zip(members.iter().map(Option::is_some)).collect();
    let holders = holders(tx, ks, worker_type, waiters, incarnations, &registered).await?;
    let mut queue: Vec<usize> = Vec::with_capacity(waiters.len());
    for (i, w) in waiters.iter().enumerate() {
        let held = match incarnations.get(i) {
            Some(Some(inc)) => holders.get(w.as_slice()).is_some_and(|h| h.as_ref() == Some(inc)),
            _ => true,
        };
        if held && registered.get(w.as_slice()).copied().unwrap_or(false) {
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
    if queue.is_empty() || paused {
        return Ok(AcceptRound { takes, more: false, next_due, paused });
    }

    let (begin, end) = ks.pending_range(worker_type);
    let rows = tx.get_range(&RangeRequest::new(begin, end).limit(queue.len()).snapshot(true)).await?;
    let full = rows.len() == queue.len();
    let parsed: Vec<Option<(i64, JobVs, Vec<u8>)>> = rows.iter().map(|(k, _)| ks.parse_pending(worker_type, k)).collect();
    let values = get_some(tx, parsed.iter().map(|p| p.as_ref().map(|(_, _, id)| ks.job(worker_type, id))), true).await?;
    let mut candidates: Vec<Candidate> = rows
        .into_iter()
        .zip(parsed)
        .zip(values)
        .map(|(((key, _), parsed), value)| Candidate { key, due: None, parsed, value })
        .collect();
    // Fewer pending jobs than waiters, and scheduled jobs due: take those
    // too, straight from scheduled (in due order), rather than wait for a
    // transaction that moves them to pending. Every pending job is taken
    // in this round as well, so no job waits behind them.
    if candidates.len() < queue.len() && next_due.is_some_and(|t| t <= now) {
        let (begin, _) = ks.scheduled_range(worker_type);
        let end = ks.scheduled_after(worker_type, key_i64(now));
        let limit = queue.len() - candidates.len();
        let due = tx.get_range(&RangeRequest::new(begin, end).limit(limit).snapshot(true)).await?;
        let ids: Vec<Option<(i64, Vec<u8>)>> = due.iter().map(|(k, _)| ks.parse_scheduled(worker_type, k)).collect();
        let values = get_some(tx, ids.iter().map(|p| p.as_ref().map(|(_, id)| ks.job(worker_type, id))), true).await?;
        for (((key, _), id), value) in due.into_iter().zip(ids).zip(values) {
            let Some((at, id)) = id else { continue };
            candidates.push(Candidate { key, due: Some(at), parsed: Some((0, [0; 12], id)), value });
        }
    }

    let mut next = 0usize; // index into `queue`
    let mut progress = false;
    let mut budget_left = true;
    let mut written = 0usize;
    let mut user_version: u16 = 0;
    for Candidate { key: pending_key, due, parsed, value } in candidates {
        let pending_key = &pending_key;
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
        let rec = match (due, value.map(|v| Record::decode(&v)).transpose()) {
            (None, Ok(Some(rec))) if rec.state == JobState::Pending && rec.vs == vs && rec.priority == priority => rec,
            (Some(at), Ok(Some(rec))) if rec.state == JobState::Scheduled && rec.run_at.map(key_i64) == Some(at) => rec,
            // A stale scheduled key: `promote_due` clears it.
            (Some(_), _) => continue,
            (None, _) => {
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
        unplace(tx, ks, worker_type, &id, &rec);
        let token = tokens[waiter];
        rec.state = JobState::Running;
        rec.worker = Some(worker.clone());
        rec.token = Some(token);
        rec.cancel_requested = false;
        rec.attempts += 1;
        place(tx, ks, worker_type, &id, &mut rec, user_version, now);
        user_version = user_version.wrapping_add(1);
        progress = true;
        takes[waiter] = Take::Job(JobHandle { job: rec.to_job(worker_type, &id, now), token });
    }
    let waiting = next < queue.len();
    let more = waiting && (!budget_left || (full && progress));
    Ok(AcceptRound { takes, more, next_due, paused })
}

/// The incarnation that holds each registered worker id some waiter
/// names an incarnation for (its health record, `None` if it names none).
/// Read as snapshots: a heartbeat rewrites the record and must not make
/// the round conflict, and the member keys, read for a write, already make
/// it retry when the id is removed or registered again meanwhile.
async fn holders<'w>(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    waiters: &'w [Vec<u8>],
    incarnations: &[Option<Incarnation>],
    registered: &HashMap<&[u8], bool>,
) -> Result<HashMap<&'w [u8], Option<Incarnation>>, StoreError> {
    let mut seen = HashSet::new();
    let named: Vec<&[u8]> = waiters
        .iter()
        .zip(incarnations)
        .filter(|(w, inc)| inc.is_some() && registered.get(w.as_slice()).copied().unwrap_or(false))
        .map(|(w, _)| w.as_slice())
        .filter(|w| seen.insert(*w))
        .collect();
    let keys: Vec<Vec<u8>> = named.iter().map(|w| ks.health(worker_type, w)).collect();
    let values = get_many(tx, &keys, true).await?;
    Ok(named
        .into_iter()
        .zip(values)
        .map(|(w, v)| (w, v.and_then(|v| Keyspace::parse_health(&v)).and_then(|h| h.incarnation)))
        .collect())
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
                found.push((j, JobHandle { job: rec.to_job(worker_type, id, place::wall_ms()), token }));
            }
        }
    }
    Ok(found)
}

/// Gives back every job that an accept round whose outcome is unknown (its
/// call failed after a commit that may have landed) took: running for one
/// of `taken`'s workers under that waiter's token. Nobody got those
/// handles, so each goes back to pending as [`give_back`] does. Reads at
/// most [`RECHECK_MAX_JOBS`] running jobs per worker. Returns how many it
/// gave back.
pub async fn reclaim(tx: &Tx, ks: &Keyspace, worker_type: &[u8], taken: &[(Vec<u8>, AcceptToken)]) -> Result<usize, StoreError> {
    let mut workers: Vec<&[u8]> = taken.iter().map(|(w, _)| w.as_slice()).collect();
    workers.sort();
    workers.dedup();
    let now = place::wall_ms();
    let mut given = 0usize;
    let mut user_version: u16 = 0;
    let mut queued = Queued::default();
    for worker in workers {
        let (begin, end) = ks.active_range(worker_type, worker);
        let rows = tx.get_range(&RangeRequest::new(begin, end).limit(RECHECK_MAX_JOBS)).await?;
        let ids: Vec<Option<Vec<u8>>> = rows.iter().map(|(k, _)| ks.parse_active_job_id(worker_type, worker, k)).collect();
        let values = get_some(tx, ids.iter().map(|id| id.as_ref().map(|id| ks.job(worker_type, id))), false).await?;
        for (id, value) in ids.iter().zip(values) {
            let (Some(id), Some(value)) = (id, value) else { continue };
            let Ok(mut rec) = Record::decode(&value) else { continue };
            let ours = rec.state == JobState::Running
                && rec.worker.as_deref() == Some(worker)
                && rec.token.is_some_and(|t| taken.iter().any(|(w, tok)| w.as_slice() == worker && *tok == t));
            if !ours {
                continue;
            }
            let end = RunEnd::Released { opts: JobOpts::default(), info: None, bump: false };
            queued.merge(end_run(tx, ks, worker_type, id, &mut rec, end, user_version, now));
            user_version = user_version.wrapping_add(1);
            given += 1;
        }
    }
    queued.wake(tx, ks, worker_type, None);
    Ok(given)
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
pub async fn give_back(tx: &Tx, ks: &Keyspace, fence: &Fence) -> Result<bool, StoreError> {
    let Some(mut rec) = read_record(tx, ks, &fence.job_type, &fence.job_id, false).await? else {
        return Ok(false);
    };
    if rec.state != JobState::Running || rec.token != Some(fence.token) {
        return Ok(false);
    }
    // Attempts count accepts: this one happened. The worker never saw
    // the job, so no attempt limit is raised either.
    let end = RunEnd::Released { opts: JobOpts::default(), info: None, bump: false };
    let queued = end_run(tx, ks, &fence.job_type, &fence.job_id, &mut rec, end, 0, place::wall_ms());
    queued.wake(tx, ks, &fence.job_type, None);
    Ok(true)
}

/// Moves up to `limit` of the type's scheduled jobs that are due by
/// `now` (this node's wall clock) to pending, in due order: the first
/// moved is the first to run among equal priorities. Returns how many it
/// moved and the earliest `run_at` left.
pub async fn promote_due(tx: &Tx, ks: &Keyspace, job_type: &[u8], now: u64, limit: usize) -> Result<(usize, Option<u64>), StoreError> {
    let (begin, end) = ks.scheduled_range(job_type);
    let rows = tx.get_range(&RangeRequest::new(begin, end).limit(limit + 1)).await?;
    let mut moved = 0usize;
    let mut next = None;
    for (key, _) in &rows {
        let Some((at, id)) = ks.parse_scheduled(job_type, key) else {
            tx.clear(key);
            continue;
        };
        let at = u64::try_from(at).unwrap_or(0);
        if at > now || moved == limit {
            next = Some(at);
            break;
        }
        match read_record(tx, ks, job_type, &id, false).await? {
            Some(mut rec) if rec.state == JobState::Scheduled && rec.run_at == Some(at) => {
                unplace(tx, ks, job_type, &id, &rec);
                rec.state = JobState::Pending;
                // < limit + 1 rows: the user versions stay distinct.
                place(tx, ks, job_type, &id, &mut rec, moved as u16, now);
                moved += 1;
            }
            // A key its record does not name: stale.
            _ => tx.clear(key),
        }
    }
    if moved > 0 {
        bump_pending(tx, ks, job_type);
    }
    Ok((moved, next))
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
pub async fn update(tx: &Tx, ks: &Keyspace, fence: &Fence, info: &[u8]) -> Result<Outcome<JobHandle>, StoreError> {
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
    if rec.stored_len() > MAX_VALUE_SIZE {
        return Ok(Err(Error::Store(StoreError::ValueTooLarge)));
    }
    write_record(tx, ks, &fence.job_type, &fence.job_id, &mut rec, 0);
    Ok(Ok(JobHandle { job: rec.to_job(&fence.job_type, &fence.job_id, now), token: fence.token }))
}

/// Ends the run the handle holds as `end` says (finish, fail, release).
pub async fn end(tx: &Tx, ks: &Keyspace, fence: &Fence, end: RunEnd) -> Result<Outcome<Job>, StoreError> {
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
    if probe.stored_len() > MAX_VALUE_SIZE {
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
pub async fn finish(tx: &Tx, ks: &Keyspace, fence: &Fence, result: &[u8]) -> Result<Outcome<Job>, StoreError> {
    end(tx, ks, fence, RunEnd::Finished(result.to_vec())).await
}

// ---- anyone's side: cancel, remove, resubmit, get, count -----------------

/// Cancels a job: a pending or scheduled one at once, a running one by
/// request (its worker's next update cancels it; a resubmission waiting
/// for the run's end is dropped), an ended one not at all (`Ok`, nothing
/// written). Returns the job as it now is.
pub async fn cancel(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8]) -> Result<Outcome<Job>, StoreError> {
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

/// The record, if `if_vs` (when given) still matches it: `Changed` when
/// the job changed since or is gone.
async fn read_if(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8], if_vs: Option<&JobVs>) -> Result<Outcome<Option<Record>>, StoreError> {
    let rec = read_record(tx, ks, job_type, id, false).await?;
    match (if_vs, &rec) {
        (Some(vs), Some(r)) if r.vs != *vs => Ok(Err(Error::Changed)),
        (Some(_), None) => Ok(Err(Error::Changed)),
        _ => Ok(Ok(rec)),
    }
}

/// Removes a job in any state; a running one's worker is then refused
/// (`not_found`).
pub async fn remove(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8]) -> Result<Outcome<()>, StoreError> {
    remove_if(tx, ks, job_type, id, None).await
}

/// [`remove`]; with `if_vs`, only if the job's `vs` is still that
/// (`Changed` otherwise; an absent job is `NotFound`).
pub async fn remove_if(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8], if_vs: Option<&JobVs>) -> Result<Outcome<()>, StoreError> {
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
    unplace(tx, ks, job_type, id, rec);
    tx.clear(&ks.job(job_type, id));
    tx.atomic_add(&ks.job_type_count(job_type), -1);
}

/// Adds the job, or runs it again (DESIGN.md `job_resubmit/4`): absent,
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
) -> Result<Outcome<()>, StoreError> {
    let rec = match read_if(tx, ks, job_type, id, if_vs).await? {
        Ok(rec) => rec,
        Err(e) => return Ok(Err(e)),
    };
    let Some(mut rec) = rec else {
        let job = JobSpec { id: id.to_vec(), info: info.to_vec(), opts: *opts };
        return add_job(tx, ks, job_type, &job, now).await;
    };
    if let Err(e) = check_index_keys(ks, job_type, id, opts.priority.unwrap_or(rec.priority)) {
        return Ok(Err(e));
    }
    let before = earliest_scheduled(tx, ks, job_type).await?;
    let mut queued = Queued::default();
    match rec.state {
        JobState::Running => {
            rec.resubmit = Some(Resubmit { info: info.to_vec(), opts: *opts });
            if rec.stored_len() > MAX_VALUE_SIZE {
                return Ok(Err(Error::Store(StoreError::ValueTooLarge)));
            }
            write_record(tx, ks, job_type, id, &mut rec, 0);
        }
        JobState::Scheduled | JobState::Pending => {
            let mut next = rec.clone();
            next.info = info.to_vec();
            apply_opts(&mut next, opts);
            let schedule = match opts.schedule {
                Some(s) => Some(s),
                None => next.run_at.filter(|_| next.state == JobState::Scheduled).map(Schedule::RunAt),
            };
            queue_state(&mut next, schedule, now);
            if next.stored_len() > MAX_VALUE_SIZE {
                return Ok(Err(Error::Store(StoreError::ValueTooLarge)));
            }
            unplace(tx, ks, job_type, id, &rec);
            place(tx, ks, job_type, id, &mut next, 0, now);
            queued.note(&next);
        }
        JobState::Finished | JobState::Canceled | JobState::Failed => {
            let mut next = rec.clone();
            apply_resubmit(&mut next, Resubmit { info: info.to_vec(), opts: *opts }, now);
            if next.stored_len() > MAX_VALUE_SIZE {
                return Ok(Err(Error::Store(StoreError::ValueTooLarge)));
            }
            unplace(tx, ks, job_type, id, &rec);
            place(tx, ks, job_type, id, &mut next, 0, now);
            queued.note(&next);
        }
    }
    queued.wake(tx, ks, job_type, before);
    Ok(Ok(()))
}

/// The job, if it exists, as this node's clock sees it.
pub async fn get(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8]) -> Result<Option<Job>, StoreError> {
    let now = place::wall_ms();
    Ok(read_record(tx, ks, job_type, id, false).await?.map(|rec| rec.to_job(job_type, id, now)))
}

/// How many of the type's scheduled jobs are due by `now`: they count as
/// pending. Reads only their keys; the dispatchers keep this near zero by
/// moving due jobs to pending while acceptors wait.
async fn due_scheduled(tx: &Tx, ks: &Keyspace, job_type: &[u8], now: u64) -> Result<u64, StoreError> {
    let (begin, _) = ks.scheduled_range(job_type);
    let end = ks.scheduled_after(job_type, key_i64(now));
    Ok(tx.get_range(&RangeRequest::new(begin, end).snapshot(true)).await?.len() as u64)
}

/// The exact number of jobs of a type that can be accepted now (pending,
/// and scheduled ones that are due): a counter and the due keys.
pub async fn pending_count(tx: &Tx, ks: &Keyspace, job_type: &[u8]) -> Result<u64, StoreError> {
    let raw = tx.get(&ks.pending_count(job_type), false).await?;
    Ok(place::read_counter(raw) + due_scheduled(tx, ks, job_type, place::wall_ms()).await?)
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
    let due = due_scheduled(tx, ks, job_type, place::wall_ms()).await?.min(out[0]);
    out[0] -= due;
    out[1] += due;
    Ok(out)
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
    departure: Departure,
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
    let mut queued = Queued::default();
    let mut user_version: u16 = 0;
    let now = place::wall_ms();
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
/// `("couch_workers", "orphans", WorkerType, Worker) = (RemovalVS,)` and
/// bumps `orphans_vs`: every node's sweeper wakes and moves the rest, in
/// transactions of the same bounds (see [`sweep_orphan`]). Until then the
/// handles of those jobs are refused all the same: `update`/`finish` see
/// the marker and compare it with the job's accept VS.
pub async fn requeue_worker_jobs(tx: &Tx, ks: &Keyspace, worker_type: &[u8], worker: &[u8], departure: Departure) -> Result<usize, StoreError> {
    let (begin, end) = ks.active_range(worker_type, worker);
    let rows = tx.get_range(&RangeRequest::new(begin, end).limit(REQUEUE_MAX_JOBS + 1)).await?;
    let take = rows.len().min(REQUEUE_MAX_JOBS);
    let batch = requeue_rows(tx, ks, worker_type, worker, &rows[..take], None, departure).await?;
    if batch.consumed < rows.len() {
        let lost = departure == Departure::Lost;
        tx.set_versionstamped_value(&ks.orphan(worker_type, worker), &record::encode_orphan_marker(lost));
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
    let Some((marker, lost)) = record::decode_orphan_marker(&value) else {
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
    let departure = if lost { Departure::Lost } else { Departure::Released };
    let batch = requeue_rows(tx, ks, worker_type, worker, &rows, Some(&marker), departure).await?;
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

// ---- listing, types, pause, pruning ---------------------------------------

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
/// The second value is the id to continue after, `None` when no job
/// follows.
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
            jobs.push(rec.to_job(job_type, id, now));
        }
    }
    let cont = if maybe_more { ids.last().cloned() } else { None };
    Ok((jobs, cont))
}

/// Pauses (`true`) or resumes the type, cluster-wide: the flag every
/// accept round reads, and a bump of `jobs_vs` so that every node's
/// dispatcher runs a round now (a resume wakes waiting acceptors at once).
pub async fn set_paused(tx: &Tx, ks: &Keyspace, job_type: &[u8], paused: bool) -> Result<(), StoreError> {
    let key = ks.paused(job_type);
    let now_paused = tx.get(&key, false).await?.is_some();
    if now_paused != paused {
        if paused {
            tx.set(&key, b"");
        } else {
            tx.clear(&key);
        }
        bump_pending(tx, ks, job_type);
    }
    Ok(())
}

/// What one pruning transaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pruned {
    /// The jobs removed, `(type, id)`.
    pub removed: Vec<(Vec<u8>, Vec<u8>)>,
    /// The earliest expiry left (Unix ms); due now if the batch was full.
    pub next: Option<u64>,
}

/// The earliest expiry (Unix ms), read as a snapshot: whether a prune is
/// due at all, without a write transaction.
pub async fn next_expiry(tx: &Tx, ks: &Keyspace) -> Result<Option<u64>, StoreError> {
    let (begin, end) = ks.expiry_range();
    let rows = tx.get_range(&RangeRequest::new(begin, end).limit(1).snapshot(true)).await?;
    Ok(rows.first().and_then(|(k, _)| ks.parse_expiry(k)).map(|(at, _, _)| u64::try_from(at).unwrap_or(0)))
}

/// Removes up to `limit` ended jobs whose `keep` ran out by `now`, in
/// expiry order. Several nodes may prune at once: each removal re-reads
/// the record in the transaction, and conflicting prunes retry.
pub async fn prune(tx: &Tx, ks: &Keyspace, now: u64, limit: usize) -> Result<Pruned, StoreError> {
    let (begin, end) = ks.expiry_range();
    let rows = tx.get_range(&RangeRequest::new(begin, end).limit(limit + 1)).await?;
    let mut out = Pruned::default();
    for (key, _) in &rows {
        let Some((at, job_type, id)) = ks.parse_expiry(key) else {
            tx.clear(key);
            continue;
        };
        let at = u64::try_from(at).unwrap_or(0);
        if at > now || out.removed.len() == limit {
            out.next = Some(at.min(if out.removed.len() == limit { now } else { at }));
            break;
        }
        match read_record(tx, ks, &job_type, &id, false).await? {
            Some(rec) if rec.state.is_terminal() && rec.expire_at == Some(at) => {
                remove_record(tx, ks, &job_type, &id, &rec);
                out.removed.push((job_type, id));
            }
            _ => tx.clear(key),
        }
    }
    Ok(out)
}
