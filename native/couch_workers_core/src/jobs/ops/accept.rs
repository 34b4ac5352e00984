//! The accept round: pending (and due scheduled) jobs handed to waiting
//! workers in queue order, the watch that wakes a dispatcher, and the move of
//! due scheduled jobs to pending.

use std::collections::{HashMap, HashSet};

use rand::RngCore;

use super::helpers::{bump_pending, can_hold, get_many, get_some, read_record};
use super::BATCH_WRITE_BUDGET;
use crate::jobs::job::{AcceptToken, JobHandle, JobState, JobVs, Keep};
use crate::jobs::place::{self, earliest_scheduled, key_i64, place, unplace};
use crate::jobs::record::Record;
use crate::keyspace::{Incarnation, Keyspace};
use crate::store::{RangeRequest, StoreError, Tx, Watch, MAX_VALUE_SIZE};

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
    /// The ids of the queued jobs this round failed because no worker can
    /// hold them ([`fail_unrunnable`]), for the node's log.
    pub unrunnable: Vec<Vec<u8>>,
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
pub async fn accept(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    acceptors: Acceptors<'_>,
) -> Result<AcceptRound, StoreError> {
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
        return Ok(AcceptRound { takes, more: false, next_due: None, paused: false, unrunnable: Vec::new() });
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
    let registered: HashMap<&[u8], bool> = distinct.iter().copied().zip(members.iter().map(Option::is_some)).collect();
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
        return Ok(AcceptRound { takes, more: false, next_due, paused, unrunnable: Vec::new() });
    }

    let (begin, end) = ks.pending_range(worker_type);
    let rows = tx.get_range(&RangeRequest::new(begin, end).limit(queue.len()).snapshot(true)).await?;
    let full = rows.len() == queue.len();
    let parsed: Vec<Option<(i64, JobVs, Vec<u8>)>> =
        rows.iter().map(|(k, _)| ks.parse_pending(worker_type, k)).collect();
    let values =
        get_some(tx, parsed.iter().map(|p| p.as_ref().map(|(_, _, id)| ks.job(worker_type, id))), true).await?;
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
    let mut unrunnable = Vec::new();
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
        // The first waiter (FIFO) that can hold the job (its active key
        // and the running record fit the limits); a job no waiter here can
        // hold stays pending for other workers, unless no worker at all
        // can: then it fails, rather than stop the queue behind it.
        let Some(pos) = queue[next..].iter().position(|&i| can_hold(ks, worker_type, &id, &rec, &waiters[i])) else {
            if rec.running_len(b"") > MAX_VALUE_SIZE {
                let mut rec = rec;
                if fail_unrunnable(tx, ks, worker_type, &id, &mut rec, user_version, now) {
                    tx.add_read_conflict_key(pending_key);
                    tx.add_read_conflict_key(&ks.job(worker_type, &id));
                    user_version = user_version.wrapping_add(1);
                    progress = true;
                    unrunnable.push(id);
                }
            }
            continue;
        };
        let active_len = ks.active(worker_type, &waiters[queue[next + pos]], &id).len();
        let cost = rec.value_len() + 2 * ks.job(worker_type, &id).len() + 2 * pending_key.len() + active_len;
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
        // (A due scheduled record written before `queued_at` was queued
        // from its run_at.)
        let queued_at = rec.queued_at.or(rec.run_at);
        rec.state = JobState::Running;
        rec.worker = Some(worker.clone());
        rec.token = Some(token);
        rec.cancel_requested = false;
        rec.attempts += 1;
        place(tx, ks, worker_type, &id, &mut rec, user_version, now);
        user_version = user_version.wrapping_add(1);
        progress = true;
        takes[waiter] = Take::Job(JobHandle { job: rec.to_job(worker_type, &id, now), token, queued_at });
    }
    let waiting = next < queue.len();
    let more = waiting && (!budget_left || (full && progress));
    Ok(AcceptRound { takes, more, next_due, paused, unrunnable })
}

/// Fails a queued job whose running record would be over the value limit
/// for any worker (one stored before `add` and `update` reserved that
/// room): nothing can run it, and left pending it would stop
/// every accept round of its type that reaches it. Failing loses nothing:
/// info, result, error, attempts and options stay in the record (it can be
/// read, resubmitted with smaller info, or removed). The reason is in the
/// node's log (`job_failed_unrunnable`), not in the record: a reason
/// would make the failed record longer than the running one that did not
/// fit. `false`, nothing written, if even the failed record would not fit
/// (a finite `keep` whose expiry encodes longer than `queued_at` did).
fn fail_unrunnable(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    id: &[u8],
    rec: &mut Record,
    user_version: u16,
    now: u64,
) -> bool {
    let mut failed = rec.clone();
    failed.state = JobState::Failed;
    failed.run_at = None;
    failed.queued_at = None;
    // As `place` writes it: a finite keep starts now.
    failed.expire_at = match failed.keep {
        Keep::Seconds(s) => Some(now.saturating_add(s.saturating_mul(1000))),
        Keep::Infinity => None,
    };
    if failed.value_len() > MAX_VALUE_SIZE {
        return false;
    }
    unplace(tx, ks, job_type, id, rec);
    rec.state = JobState::Failed;
    place(tx, ks, job_type, id, rec, user_version, now);
    true
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
        let ids: Vec<Option<Vec<u8>>> =
            rows.iter().map(|(k, _)| ks.parse_active_job_id(worker_type, worker, k)).collect();
        let values = get_some(tx, ids.iter().map(|id| id.as_ref().map(|id| ks.job(worker_type, id))), true).await?;
        for (id, value) in ids.iter().zip(values) {
            let (Some(id), Some(value)) = (id, value) else { continue };
            let Ok(rec) = Record::decode(&value) else { continue };
            if rec.state != JobState::Running || rec.worker.as_deref() != Some(worker.as_slice()) {
                continue;
            }
            let Some(token) = rec.token else { continue };
            let mine = queue
                .iter()
                .find(|&&j| waiters[j] == *worker && tokens[j] == token && !found.iter().any(|(f, _)| *f == j));
            if let Some(&j) = mine {
                tx.add_read_conflict_key(&ks.job(worker_type, id));
                found.push((
                    j,
                    JobHandle { job: rec.to_job(worker_type, id, place::wall_ms()), token, queued_at: None },
                ));
            }
        }
    }
    Ok(found)
}

/// The type's `jobs_vs` as this transaction sees it, read as a snapshot:
/// an accept round reads it so that [`pending_watch`], armed after the
/// round's commit, can tell whether a job became pending in between. A
/// snapshot read adds no read conflict, so adds (which write the key) do
/// not abort the round.
pub async fn pending_version(tx: &Tx, ks: &Keyspace, job_type: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
    tx.get(&ks.jobs_vs(job_type), true).await
}

/// Reads the type's `jobs_vs` (as a snapshot) and returns it with a watch
/// on it, armed when this transaction commits: a job that becomes pending
/// after this transaction's reads fires it. Run it in a read-only
/// transaction: on FoundationDB creating a watch reads the key without
/// `snapshot`, so in a writing transaction every concurrent add would
/// make the commit conflict (`tests/sim_accept_watch.rs`).
pub async fn pending_watch(tx: &Tx, ks: &Keyspace, job_type: &[u8]) -> Result<(Option<Vec<u8>>, Watch), StoreError> {
    let key = ks.jobs_vs(job_type);
    let seen = tx.get(&key, true).await?;
    Ok((seen, tx.watch(&key)))
}

/// Moves up to `limit` of the type's scheduled jobs that are due by
/// `now` (this node's wall clock) to pending, in due order: the first
/// moved is the first to run among equal priorities. Returns how many it
/// moved and the earliest `run_at` left.
pub async fn promote_due(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    now: u64,
    limit: usize,
) -> Result<(usize, Option<u64>), StoreError> {
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
