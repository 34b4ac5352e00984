//! One round's hand-out: each job offered to the round goes to the first
//! waiter (FIFO) that can hold it, or is left, cleared or failed.

use super::limits::{Admit, Limits};
use super::{fail_unrunnable, Take};
use crate::jobs::job::{AcceptToken, JobHandle, JobState, JobVs};
use crate::jobs::ops::helpers::can_hold;
use crate::jobs::ops::BATCH_WRITE_BUDGET;
use crate::jobs::place::{key_i64, place, unplace};
use crate::jobs::record::Record;
use crate::keyspace::Keyspace;
use crate::store::{Tx, MAX_KEY_SIZE, MAX_VALUE_SIZE};

/// A job a round may take: a pending key, or (`due`) the scheduled key
/// of a job due now.
pub(super) struct Candidate {
    pub key: Vec<u8>,
    /// The scheduled key's `run_at`, for a due scheduled job.
    pub due: Option<i64>,
    /// The pending key's priority, VS and id (for a due job: its id).
    pub parsed: Option<(i64, JobVs, Vec<u8>)>,
    pub value: Option<Vec<u8>>,
}

/// What became of an offered job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Offered {
    /// Taken for a waiter.
    Taken,
    /// Left as it is: no waiter of the round can hold it (or a stale
    /// scheduled key, which `promote_due` clears).
    Left,
    /// A stale key cleared, or a job no worker can hold failed.
    Cleared,
    /// The round's write budget is spent: nothing more is taken.
    Full,
    /// The type runs as many jobs as its `max_running` allows: nothing
    /// more is taken.
    AtLimit,
}

/// The waiters of a round still to serve, and what the round wrote.
pub(super) struct Taking<'a> {
    waiters: &'a [Vec<u8>],
    tokens: &'a [AcceptToken],
    /// The waiters that may take a job (registered, by the incarnation
    /// they name), in FIFO order; those before `next` are served.
    queue: Vec<usize>,
    next: usize,
    pub takes: Vec<Take>,
    /// Something changed in the queue (a job taken, a stale key cleared).
    pub progress: bool,
    /// The round's write budget is spent.
    pub full: bool,
    written: usize,
    user_version: u16,
    pub unrunnable: Vec<Vec<u8>>,
    now: u64,
    /// The type's running limits, and what this round took under them.
    pub limits: Limits,
}

impl<'a> Taking<'a> {
    pub fn new(
        waiters: &'a [Vec<u8>],
        tokens: &'a [AcceptToken],
        queue: Vec<usize>,
        takes: Vec<Take>,
        now: u64,
        limits: Limits,
    ) -> Self {
        Taking {
            waiters,
            tokens,
            queue,
            next: 0,
            takes,
            progress: false,
            full: false,
            written: 0,
            user_version: 0,
            unrunnable: Vec::new(),
            now,
            limits,
        }
    }

    /// Waiters still without a job.
    pub fn left(&self) -> usize {
        self.queue.len() - self.next
    }

    /// The type runs as many jobs as it may: the round takes no more.
    pub fn at_limit(&self) -> bool {
        self.limits.type_full()
    }

    /// Whether any waiter still without a job has a worker id short enough
    /// for job `id`'s active key (the key half of [`can_hold`], which
    /// needs no read).
    pub fn key_fits(&self, ks: &Keyspace, job_type: &[u8], id: &[u8]) -> bool {
        self.queue[self.next..].iter().any(|&i| ks.active(job_type, &self.waiters[i], id).len() <= MAX_KEY_SIZE)
    }

    /// Offers one job to the waiters still without one: the first (FIFO)
    /// that can hold it (its active key and the running record fit the
    /// limits) takes it. A job no waiter here can hold stays queued for
    /// other workers, unless no worker at all can: then it fails, rather
    /// than stop the queue behind it.
    pub fn offer(&mut self, tx: &Tx, ks: &Keyspace, job_type: &[u8], candidate: Candidate) -> Offered {
        let Candidate { key, due, parsed, value } = candidate;
        let Some((priority, vs, id)) = parsed else {
            // Not a key this code writes: clear it, or it would sit at the
            // head of the queue forever.
            tx.add_read_conflict_key(&key);
            tx.clear(&key);
            self.progress = true;
            return Offered::Cleared;
        };
        let rec = match (due, value.map(|v| Record::decode(&v)).transpose()) {
            (None, Ok(Some(rec))) if rec.state == JobState::Pending && rec.vs == vs && rec.priority == priority => rec,
            (Some(at), Ok(Some(rec))) if rec.state == JobState::Scheduled && rec.run_at.map(key_i64) == Some(at) => rec,
            // A stale scheduled key: `promote_due` clears it.
            (Some(_), _) => return Offered::Left,
            (None, _) => {
                // A stale pending key (its record is gone, changed or
                // unreadable): drop it with its count.
                tx.add_read_conflict_key(&key);
                tx.clear(&key);
                tx.atomic_add(&ks.pending_count(job_type), -1);
                self.progress = true;
                return Offered::Cleared;
            }
        };
        // A group whose running counter's key would be over the key limit:
        // no accept could commit the job.
        if rec.group.as_ref().is_some_and(|g| ks.group_running(job_type, g).len() > MAX_KEY_SIZE) {
            return self.fail(tx, ks, job_type, &key, id, rec);
        }
        match self.limits.admit(rec.group.as_deref()) {
            Admit::Yes => {}
            Admit::TypeFull => return Offered::AtLimit,
            Admit::GroupFull => return Offered::Left,
        }
        let waiters = self.waiters;
        let Some(pos) = self.queue[self.next..].iter().position(|&i| can_hold(ks, job_type, &id, &rec, &waiters[i]))
        else {
            if rec.running_len(b"") > MAX_VALUE_SIZE {
                return self.fail(tx, ks, job_type, &key, id, rec);
            }
            return Offered::Left;
        };
        let active_len = ks.active(job_type, &waiters[self.queue[self.next + pos]], &id).len();
        let cost = rec.value_len() + 2 * ks.job(job_type, &id).len() + 2 * key.len() + active_len;
        if self.written > 0 && self.written + cost > BATCH_WRITE_BUDGET {
            self.full = true;
            return Offered::Full;
        }
        self.written += cost;
        self.queue[self.next..].swap(0, pos);
        let waiter = self.queue[self.next];
        self.next += 1;

        tx.add_read_conflict_key(&key);
        tx.add_read_conflict_key(&ks.job(job_type, &id));
        self.limits.took(tx, ks, job_type, rec.group.as_deref());
        let mut rec = rec;
        unplace(tx, ks, job_type, &id, &rec);
        let token = self.tokens[waiter];
        // (A due scheduled record written before `queued_at` was queued
        // from its run_at.)
        let queued_at = rec.queued_at.or(rec.run_at);
        rec.state = JobState::Running;
        rec.worker = Some(waiters[waiter].clone());
        rec.token = Some(token);
        rec.cancel_requested = false;
        rec.attempts += 1;
        place(tx, ks, job_type, &id, &mut rec, self.user_version, self.now);
        self.user_version = self.user_version.wrapping_add(1);
        self.progress = true;
        self.takes[waiter] = Take::Job(JobHandle { job: rec.to_job(job_type, &id, self.now), token, queued_at });
        Offered::Taken
    }

    /// Fails a queued job that no worker can run ([`fail_unrunnable`]),
    /// or leaves it if even its failed record would not fit.
    fn fail(&mut self, tx: &Tx, ks: &Keyspace, job_type: &[u8], key: &[u8], id: Vec<u8>, mut rec: Record) -> Offered {
        if !fail_unrunnable(tx, ks, job_type, &id, &mut rec, self.user_version, self.now) {
            return Offered::Left;
        }
        tx.add_read_conflict_key(key);
        tx.add_read_conflict_key(&ks.job(job_type, &id));
        self.user_version = self.user_version.wrapping_add(1);
        self.progress = true;
        self.unrunnable.push(id);
        Offered::Cleared
    }
}
