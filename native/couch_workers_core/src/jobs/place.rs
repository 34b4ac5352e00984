//! Where a job's state is written down besides its record: the one place
//! that keeps the indexes and counters of every state in step.
//!
//! Every state has its counter `("counts", JobType, State)` and its index
//! `("by_state", JobType, State, JobId)`; some states have one more key:
//!
//! | state | its own key |
//! | --- | --- |
//! | `scheduled` | `("scheduled", JobType, RunAt, JobId)` (the timers read it) |
//! | `pending` | `("pending", JobType, Priority, VS, JobId)` (the queue) |
//! | `running` | `("active", WorkerType, Worker, JobId)` (failover reads it); with an activity timeout, `("activity", JobType, TimeoutS, VS, JobId)` (`activity.rs`) |
//! | `finished`, `canceled`, `failed` | `("expiry", ExpireAt, JobType, JobId)` with a finite `keep` (the pruner reads it; a short one also bumps `expiry_vs`) |
//!
//! A job with a unique key holds `("unique", JobType, Key)` from its add
//! (or the resubmit that queues it again) until it ends or is removed:
//! claimed by `ops/unique.rs`, given up here ([`give_up_unique`]).
//!
//! A state change is [`unplace`] of the record as stored, then [`place`]
//! of the changed record, in one transaction: every counter moves by
//! exactly −1/+1 with its index keys, so `job_counts` stays exact. A write
//! that keeps the state (new info, a cancel request) only rewrites the
//! record ([`write_record`]).

use std::time::{SystemTime, UNIX_EPOCH};

use super::{activity, history, limits};
use super::job::{JobState, Keep, Schedule};
use super::record::{self, incomplete_vs, Record};
use crate::keyspace::Keyspace;
use crate::store::{RangeRequest, StoreError, Tx};

/// This node's wall clock in Unix ms: schedules are read on the clock of
/// the node that checks them; a node whose clock is behind
/// runs a job late, never early by its own clock, and never loses it.
pub fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A job that ends with a `keep` shorter than this (seconds) bumps
/// `expiry_vs`, which wakes the pruners: they sleep up to half of it
/// between looks (`pruner.rs`), so a longer keep falls due after their next
/// look anyway.
pub(crate) const WAKE_KEEP_S: u64 = 60;

pub(crate) fn key_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Writes the record, in the state it is stored in, with a fresh
/// versionstamp of `user_version`. A running job's write is a change of
/// it: its activity index key moves with the versionstamp.
pub(crate) fn write_record(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8], rec: &mut Record, user_version: u16) {
    activity::unindex(tx, ks, job_type, id, rec);
    activity::index(tx, ks, job_type, id, rec, user_version);
    store_record(tx, ks, job_type, id, rec, user_version);
}

/// Writes the record with a fresh versionstamp of `user_version`.
fn store_record(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8], rec: &mut Record, user_version: u16) {
    rec.vs = incomplete_vs(user_version);
    tx.set_versionstamped_value(&ks.job(job_type, id), &rec.encode(user_version));
}

fn state_key(rec: &Record) -> &'static [u8] {
    rec.state.name().as_bytes()
}

/// Takes the record, as stored, out of its state's keys and counter.
pub(crate) fn unplace(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8], rec: &Record) {
    match rec.state {
        JobState::Scheduled => {
            if let Some(at) = rec.run_at {
                tx.clear(&ks.scheduled(job_type, key_i64(at), id));
            }
        }
        JobState::Pending => tx.clear(&ks.pending(job_type, rec.priority, &rec.vs, id)),
        JobState::Running => {
            if let Some(worker) = &rec.worker {
                tx.clear(&ks.active(job_type, worker, id));
            }
            activity::unindex(tx, ks, job_type, id, rec);
        }
        JobState::Finished | JobState::Canceled | JobState::Failed => {
            if let Some(at) = rec.expire_at {
                tx.clear(&ks.expiry(key_i64(at), job_type, id));
            }
        }
    }
    tx.clear(&ks.by_state(job_type, state_key(rec), id));
    tx.atomic_add(&ks.state_count(job_type, state_key(rec)), -1);
    limits::count_running_group(tx, ks, job_type, rec, -1);
}

/// Puts the record into the keys and counter of `rec.state` and writes
/// it. A `running` record names its worker; a `scheduled` one its
/// `run_at`. An ended record's `keep` starts now (`now_ms`).
pub(crate) fn place(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    id: &[u8],
    rec: &mut Record,
    user_version: u16,
    now_ms: u64,
) {
    if rec.state != JobState::Scheduled {
        rec.run_at = None;
    }
    if rec.state != JobState::Running {
        rec.worker = None;
        rec.token = None;
        rec.cancel_requested = false;
    }
    rec.expire_at = None;
    // Since when it can be accepted: a scheduled job from its run_at; a
    // pending one from when it became pending, kept while it stays queued
    // (a resubmit of a queued job, a promotion keep theirs); nil
    // otherwise (an accept moves it into its handle first).
    match rec.state {
        JobState::Scheduled => {}
        JobState::Pending => {
            rec.queued_at.get_or_insert(now_ms);
        }
        _ => rec.queued_at = None,
    }
    match rec.state {
        JobState::Scheduled => {
            let at = rec.run_at.unwrap_or(now_ms);
            rec.run_at = Some(at);
            rec.queued_at = Some(at);
            tx.set(&ks.scheduled(job_type, key_i64(at), id), b"");
        }
        JobState::Pending => {
            let group = limits::pending_value(rec);
            tx.set_versionstamped_key(&ks.pending_new(job_type, rec.priority, user_version, id), &group);
        }
        JobState::Running => {
            if let Some(worker) = &rec.worker {
                tx.set_versionstamped_value(&ks.active(job_type, worker, id), &record::encode_active(user_version));
                // Only an accept makes a job running: a run starts.
                history::start_run(tx, ks, job_type, id, rec, now_ms);
            }
            activity::index_run(tx, ks, job_type, id, rec, user_version);
        }
        JobState::Finished | JobState::Canceled | JobState::Failed => {
            give_up_unique(tx, ks, job_type, rec);
            if let Keep::Seconds(s) = rec.keep {
                let at = now_ms.saturating_add(s.saturating_mul(1000));
                rec.expire_at = Some(at);
                tx.set(&ks.expiry(key_i64(at), job_type, id), b"");
                // Pruners sleep up to a while between looks: a job due
                // sooner than their next look must wake them.
                if s < WAKE_KEEP_S {
                    tx.set_versionstamped_value(&ks.expiry_vs(), &Keyspace::vs_placeholder_value());
                }
            }
        }
    }
    tx.set(&ks.by_state(job_type, state_key(rec), id), b"");
    tx.atomic_add(&ks.state_count(job_type, state_key(rec)), 1);
    limits::count_running_group(tx, ks, job_type, rec, 1);
    store_record(tx, ks, job_type, id, rec, user_version);
}

/// Sets `rec` to be queued: `scheduled` until the schedule's time, or
/// `pending` if that is not in the future (or there is none). Its
/// `queued_at` too, as [`place`] will write it, so that a size check
/// between the two counts the record that is written.
pub(crate) fn queue_state(rec: &mut Record, schedule: Option<Schedule>, now_ms: u64) {
    match schedule.map(|s| s.run_at(now_ms)) {
        Some(at) if at > now_ms => {
            rec.state = JobState::Scheduled;
            rec.run_at = Some(at);
            rec.queued_at = Some(at);
        }
        _ => {
            rec.state = JobState::Pending;
            rec.queued_at.get_or_insert(now_ms);
        }
    }
}

/// What a transaction queued, so that it wakes the dispatchers once at
/// its end ([`Queued::wake`]).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Queued {
    /// A job became pending.
    pub pending: bool,
    /// The earliest `run_at` of the jobs it scheduled.
    pub earliest: Option<u64>,
}

impl Queued {
    pub fn note(&mut self, rec: &Record) {
        match rec.state {
            JobState::Pending => self.pending = true,
            JobState::Scheduled => {
                if let Some(at) = rec.run_at {
                    self.earliest = Some(self.earliest.map_or(at, |e| e.min(at)));
                }
            }
            _ => {}
        }
    }

    /// Adds what another part of the same transaction queued.
    pub fn merge(&mut self, other: Queued) {
        self.pending |= other.pending;
        if let Some(at) = other.earliest {
            self.earliest = Some(self.earliest.map_or(at, |e| e.min(at)));
        }
    }

    /// Bumps the type's `jobs_vs` if a job became pending, or if a job
    /// was scheduled before every scheduled job that `before` (read at the
    /// transaction's start, see [`earliest_scheduled`]) saw: each node's
    /// dispatcher then re-arms its timer for it. An earlier schedule also
    /// bumps the global `scheduled_vs`, which every node's promoter
    /// watches (it serves every type, new ones included).
    pub fn wake(self, tx: &Tx, ks: &Keyspace, job_type: &[u8], before: Option<u64>) {
        let earlier = match (self.earliest, before) {
            (Some(new), Some(old)) => new < old,
            (Some(_), None) => true,
            _ => false,
        };
        if self.pending || earlier {
            bump_jobs_vs(tx, ks, job_type);
        }
        if earlier {
            tx.set_versionstamped_value(&ks.scheduled_vs(), &Keyspace::vs_placeholder_value());
        }
    }
}

/// Clears the unique key that `rec` holds, if it has one: it ends, or is
/// removed (its caller knows it had not ended). Blind: the key holds this
/// job's id while the job has not ended (claims check it).
pub(crate) fn give_up_unique(tx: &Tx, ks: &Keyspace, job_type: &[u8], rec: &Record) {
    if let Some(key) = &rec.unique {
        tx.clear(&ks.unique(job_type, key));
    }
}

pub(crate) fn bump_jobs_vs(tx: &Tx, ks: &Keyspace, job_type: &[u8]) {
    tx.set_versionstamped_value(&ks.jobs_vs(job_type), &Keyspace::vs_placeholder_value());
}

/// The earliest `run_at` among the type's scheduled jobs (a snapshot
/// read: scheduling does not conflict with it). Read it before the
/// transaction writes scheduled keys of its own.
pub(crate) async fn earliest_scheduled(tx: &Tx, ks: &Keyspace, job_type: &[u8]) -> Result<Option<u64>, StoreError> {
    let (begin, end) = ks.scheduled_range(job_type);
    let rows = tx.get_range(&RangeRequest::new(begin, end).limit(1).snapshot(true)).await?;
    Ok(rows.first().and_then(|(k, _)| ks.parse_scheduled(job_type, k)).map(|(at, _)| u64::try_from(at).unwrap_or(0)))
}

/// A counter's value (little-endian i64; absent is 0, negative reads 0).
pub(crate) fn read_counter(raw: Option<Vec<u8>>) -> u64 {
    let mut le = [0u8; 8];
    if let Some(raw) = raw {
        let n = raw.len().min(8);
        le[..n].copy_from_slice(&raw[..n]);
    }
    u64::try_from(i64::from_le_bytes(le)).unwrap_or(0)
}
