//! The accept round: pending (and due scheduled) jobs handed to waiting
//! workers in queue order, the watch that wakes a dispatcher, and the move of
//! due scheduled jobs to pending.
//!
//! * `scan`: the order in which a round reads and offers pending jobs;
//! * `spread`: where a round starts after a failed attempt;
//! * `claims`: the jobs a node's takes have in flight, which its other
//!   takes offer last;
//! * `taking`: each offered job to the first waiter that can hold it;
//! * `limits`: the type's running limits, as a round applies them.

mod claims;
mod limits;
mod scan;
mod spread;
mod taking;

use std::collections::{HashMap, HashSet};

use rand::RngCore;

use super::helpers::{bump_pending, get_many, get_some, read_record};
use crate::jobs::job::{AcceptToken, JobHandle, JobState, Keep};
use crate::jobs::place::{self, earliest_scheduled, key_i64, place, unplace};
use crate::jobs::record::Record;
use crate::keyspace::{Incarnation, Keyspace};
use crate::store::{RangeRequest, StoreError, Tx, Watch, MAX_VALUE_SIZE};
use limits::Limits;
use scan::Scan;
use taking::{Candidate, Offered, Taking};

pub use claims::{Claimed, Claims};

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
    /// How many attempts of this round failed before this one. A retry
    /// after a conflict starts at a random job a little down the queue
    /// rather than at its head, which the takers that beat it keep
    /// taking ([`spread`]): so one taker cannot lose every race to the
    /// others until its budget ends.
    pub retries: u32,
    /// The claims of this take among the node's takes in flight
    /// ([`Claims`]): it passes over the pending jobs the others are
    /// taking. `None`: it claims nothing and passes over nothing.
    pub claims: Option<&'a Claimed<'a>>,
}

impl<'a> Acceptors<'a> {
    /// The waiters of attempt `attempt` (1 for the first) of a round that
    /// claims what it takes: it begins the attempt in `claims` (the last
    /// attempt's claims are over with its failed commit), rechecks after
    /// a failed attempt and spreads by the attempts that failed.
    pub fn attempt(
        workers: &'a [Vec<u8>],
        incarnations: &'a [Option<Incarnation>],
        tokens: &'a [AcceptToken],
        attempt: u32,
        claims: &'a Claimed<'a>,
    ) -> Self {
        claims.begin_attempt();
        let retries = attempt.saturating_sub(1);
        Acceptors { workers, incarnations, tokens, recheck: retries > 0, retries, claims: Some(claims) }
    }
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
    /// Waiters were left while a running limit of the type held jobs
    /// back: a run that ends anywhere may serve them, so their dispatcher
    /// also watches the type's running counter ([`round_watch`]).
    pub held_back: bool,
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
/// retries, and its retry starts further down the queue ([`spread`]).
/// Each worker's member key is read without snapshot, so a concurrent
/// removal of the worker either sees the new active keys (and requeues
/// them) or makes this round retry and find the worker gone.
///
/// Jobs that no waiter of the round can hold (their active key or running
/// record would be over a limit for its workers) stay pending for other
/// workers, and the round reads on past them ([`scan::SCAN_PAST_BYTES`]), so
/// that a lone waiter is not stopped by a job at the head that only
/// others can run.
pub async fn accept(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    acceptors: Acceptors<'_>,
) -> Result<AcceptRound, StoreError> {
    let now = place::wall_ms();
    let Acceptors { workers: waiters, incarnations, tokens, recheck, retries, claims } = acceptors;
    if tokens.len() != waiters.len() {
        return Err(StoreError::Invalid("accept: one token per waiter".into()));
    }
    if !incarnations.is_empty() && incarnations.len() != waiters.len() {
        return Err(StoreError::Invalid("accept: one incarnation per waiter, or none".into()));
    }
    let mut takes = vec![Take::NoJob; waiters.len()];
    if waiters.is_empty() {
        return Ok(AcceptRound {
            takes,
            more: false,
            next_due: None,
            paused: false,
            unrunnable: Vec::new(),
            held_back: false,
        });
    }
    // Not a snapshot: a pause that commits while this round runs makes it
    // retry, and the retry sees the pause. The type's limits are read at
    // the same time (no extra wait for an unlimited type).
    let paused_key = ks.paused(worker_type);
    let (paused, limits) = futures::try_join!(tx.get(&paused_key, false), Limits::read(tx, ks, worker_type))?;
    let paused = paused.is_some();
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
        return Ok(AcceptRound { takes, more: false, next_due, paused, unrunnable: Vec::new(), held_back: false });
    }

    let mut taking = Taking::new(waiters, tokens, queue, takes, now, limits);
    if taking.at_limit() {
        // The type is full: nothing is read, and the waiters wait for a
        // run to end (or the limit to rise).
        let Taking { takes, .. } = taking;
        return Ok(AcceptRound { takes, more: false, next_due, paused, unrunnable: Vec::new(), held_back: true });
    }
    let read_all = take_pending(tx, ks, worker_type, &mut taking, retries, claims).await?;
    // Every pending job was offered, waiters are left, and scheduled jobs
    // are due: take those too, straight from scheduled (in due order),
    // rather than wait for a transaction that moves them to pending. No
    // pending job waits behind them.
    if read_all && taking.left() > 0 && !taking.full && !taking.at_limit() && next_due.is_some_and(|t| t <= now) {
        take_due(tx, ks, worker_type, &mut taking, now).await?;
    }
    // Waiters left while pending jobs may remain that this round did not
    // offer (the write budget ran out, or it read as far as it may after
    // clearing stale keys): another round at once rather than a watch.
    // (Not while the type is full: a run that ends wakes them.)
    let more = taking.left() > 0 && !taking.at_limit() && (taking.full || (!read_all && taking.progress));
    let held_back = taking.left() > 0 && taking.limits.held_back;
    let Taking { takes, unrunnable, .. } = taking;
    Ok(AcceptRound { takes, more, next_due, paused, unrunnable, held_back })
}

/// Offers the type's pending jobs to the round's waiters until each has
/// one, in the order [`Scan`] reads them. Returns whether every pending
/// job was offered (none left unread).
async fn take_pending(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    taking: &mut Taking<'_>,
    retries: u32,
    claims: Option<&Claimed<'_>>,
) -> Result<bool, StoreError> {
    let mut scan = Scan::start(tx, ks, worker_type, taking.left(), retries, claims).await?;
    while taking.left() > 0 && !taking.full && !taking.at_limit() {
        let batch = scan.next_batch(tx, taking).await?;
        if batch.is_empty() {
            break;
        }
        let ids = batch.iter().map(|(_, p)| p.as_ref().map(|(_, _, id)| ks.job(worker_type, id)));
        let values = get_some(tx, ids, true).await?;
        load_groups(tx, ks, worker_type, taking, &values).await?;
        for ((key, parsed), value) in batch.into_iter().zip(values) {
            let offered = if taking.full || taking.at_limit() {
                Offered::Full
            } else {
                let candidate = Candidate { key: key.clone(), due: None, parsed, value };
                taking.offer(tx, ks, worker_type, candidate)
            };
            if offered != Offered::Taken {
                scan.passed(&key);
            }
        }
    }
    Ok(scan.read_all())
}

/// Offers the type's scheduled jobs due by `now` (in due order) to the
/// waiters still without a job.
async fn take_due(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    taking: &mut Taking<'_>,
    now: u64,
) -> Result<(), StoreError> {
    let (begin, _) = ks.scheduled_range(worker_type);
    let end = ks.scheduled_after(worker_type, key_i64(now));
    let due = tx.get_range(&RangeRequest::new(begin, end).limit(taking.left()).snapshot(true)).await?;
    let ids: Vec<Option<(i64, Vec<u8>)>> = due.iter().map(|(k, _)| ks.parse_scheduled(worker_type, k)).collect();
    let values = get_some(tx, ids.iter().map(|p| p.as_ref().map(|(_, id)| ks.job(worker_type, id))), true).await?;
    load_groups(tx, ks, worker_type, taking, &values).await?;
    for (((key, _), id), value) in due.into_iter().zip(ids).zip(values) {
        let Some((at, id)) = id else { continue };
        let candidate = Candidate { key, due: Some(at), parsed: Some((0, [0; 12], id)), value };
        if matches!(taking.offer(tx, ks, worker_type, candidate), Offered::Full | Offered::AtLimit) {
            break;
        }
    }
    Ok(())
}

/// Under a per-group limit, reads the counters of the groups of the
/// records about to be offered (`values`), which the offers check.
async fn load_groups(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    taking: &mut Taking<'_>,
    values: &[Option<Vec<u8>>],
) -> Result<(), StoreError> {
    if !taking.limits.per_group() {
        return Ok(());
    }
    let groups = values.iter().flatten().filter_map(|v| Record::decode(v).ok()).filter_map(|r| r.group);
    taking.limits.load(tx, ks, job_type, groups).await
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

/// What wakes the waiters a round left: `jobs_vs`, and, when a running
/// limit held jobs back (`held_back`), the type's running counter too
/// (a run that ends anywhere moves it). Their values as this transaction
/// sees them, as snapshots ([`pending_version`], for [`round_watch`]).
pub async fn round_version(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    held_back: bool,
) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
    let mut seen = vec![pending_version(tx, ks, job_type).await?];
    if held_back {
        seen.push(tx.get(&ks.state_count(job_type, limits::RUNNING), true).await?);
    }
    Ok(seen)
}

/// [`pending_watch`] over the keys of [`round_version`]: their values,
/// and one watch that fires when any of them changes. Run it in a
/// read-only transaction.
pub async fn round_watch(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    held_back: bool,
) -> Result<(Vec<Option<Vec<u8>>>, Watch), StoreError> {
    let (vs, watch) = pending_watch(tx, ks, job_type).await?;
    if !held_back {
        return Ok((vec![vs], watch));
    }
    let running = ks.state_count(job_type, limits::RUNNING);
    let count = tx.get(&running, true).await?;
    let ended = tx.watch(&running);
    let either: Watch = Box::pin(async move { futures::future::select(watch, ended).await.factor_first().0 });
    Ok((vec![vs, count], either))
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
