//! The stored values of the job queue: the job record, the active value,
//! the orphan marker, encoded and decoded with their format versions. What
//! each element means, and which formats are still read:
//! `docs/keyspace.md` ("Values").

use foundationdb_tuple::{pack, pack_with_versionstamp, unpack, Bytes, Element, Versionstamp as TupleVs};

use super::job::{
    AcceptToken, ActivityTimeout, Job, JobIncarnation, JobOpts, JobState, JobVs, Keep, MaxAttempts, Outcome, Schedule,
};
use crate::store::StoreError;

/// The format version of job records written by this code for a job
/// with none of format 5's elements (no unique key): what every node
/// since format 4 reads.
pub const RECORD_FORMAT: i64 = 4;

/// Job records that carry `Unique` (format 4 and one more element).
const RECORD_FORMAT_5: i64 = 5;

/// Job records that carry a group or an activity timeout of their own:
/// format 4 and `Unique`, `Group`, `ActivityTimeout` (each nil when
/// unset). Written only for jobs given one of the two, so that nodes that
/// read format 5 and older keep reading every other job.
const RECORD_FORMAT_6: i64 = 6;

/// Job records that carry their run (`jobs/history.rs`): format 6 and
/// four more elements, `RunStartedAt`, `RunWorker | nil`, `RunEndedAt |
/// nil`, `RunOutcome | nil`. Written from a job's first accept on, so
/// that the start and end of a run cost no key of their own.
const RECORD_FORMAT_7: i64 = 7;

/// Job records written before `Incarnation` (still read).
const RECORD_FORMAT_3: i64 = 3;

/// Job records written before `QueuedAt` (still read).
const RECORD_FORMAT_2: i64 = 2;

/// The format of the other values (active, orphan marker) and of job
/// records written before format 2.
pub const VALUE_FORMAT: i64 = 1;

/// A resubmission waiting for the end of a run: the info and the options
/// given to `resubmit` (options not given keep the job's values when it is
/// queued again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resubmit {
    pub info: Vec<u8>,
    pub opts: JobOpts,
}

/// A decoded job record (without its key's type and id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub state: JobState,
    pub worker: Option<Vec<u8>>,
    pub priority: i64,
    pub attempts: u64,
    pub token: Option<AcceptToken>,
    pub cancel_requested: bool,
    pub vs: JobVs,
    pub info: Vec<u8>,
    pub result: Option<Vec<u8>>,
    pub error: Option<Vec<u8>>,
    pub max_attempts: MaxAttempts,
    pub run_at: Option<u64>,
    pub keep: Keep,
    pub expire_at: Option<u64>,
    pub resubmit: Option<Resubmit>,
    /// Unix ms since which it can be accepted (pending or scheduled only).
    pub queued_at: Option<u64>,
    /// Drawn by `add` ([`Record::new`]); every other write decodes the
    /// record and keeps it. `None` in records written before format 4.
    pub incarnation: Option<JobIncarnation>,
    /// The unique key the job holds while it is not ended (format 5).
    pub unique: Option<Vec<u8>>,
    /// The job's group (format 6).
    pub group: Option<Vec<u8>>,
    /// The job's own activity timeout; `None`: its type's (format 6).
    pub activity_timeout: Option<ActivityTimeout>,
    /// When the run numbered `attempts` started (the running one, or the
    /// last one until the next accept): Unix ms on the accepting node's
    /// wall clock (format 7). `None` before the first accept, after a
    /// resubmit that queues the job anew, and in a record whose run an
    /// older version started.
    pub run_started_at: Option<u64>,
    /// How that run ended, once it has (format 7).
    pub run_ended: Option<RunEnded>,
}

/// The end of a job's last run, kept in its record until its next accept
/// moves the run into the job's history keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunEnded {
    pub worker: Vec<u8>,
    /// Unix ms on the ending node's wall clock.
    pub ended_at: u64,
    pub outcome: Outcome,
}

/// A fresh incarnation for a job being added: 8 random bytes, none of
/// them zero, which the tuple layer would escape into two. Its encoding is
/// then always 10 bytes, and the largest info a job can have does not
/// depend on the draw. (255^8 values: a repeat has probability below
/// 10^-19.)
fn new_incarnation() -> JobIncarnation {
    std::array::from_fn(|_| rand::random_range(1..=u8::MAX))
}

/// A 12-byte tuple versionstamp whose commit part is still unknown:
/// `0xff` × 10 then the user version (what the tuple layer packs as
/// incomplete). Jobs returned by a transaction carry it until the commit's
/// versionstamp is known ([`complete_vs`]).
pub(crate) fn incomplete_vs(user_version: u16) -> JobVs {
    *TupleVs::incomplete(user_version).as_bytes()
}

/// Fills the commit part of an incomplete versionstamp.
/// Whether `vs` still waits for its commit's versionstamp.
pub(crate) fn is_incomplete(vs: &JobVs) -> bool {
    vs[..10] == [0xff; 10]
}

pub(crate) fn complete_vs(vs: &mut JobVs, commit: &crate::store::Versionstamp) {
    if is_incomplete(vs) {
        vs[..10].copy_from_slice(commit);
    }
}

/// The error a run lost with its worker records (a death: reaped, or
/// replaced by a new registration of its id).
pub(crate) fn worker_lost_error() -> Vec<u8> {
    br#"{"reason":"worker_lost"}"#.to_vec()
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Invalid(format!("corrupt job record: {what}"))
}

impl Record {
    /// A new record, not yet placed in a state (see `ops::place`):
    /// `opts` with their defaults, `keep` defaulting to infinity, and an
    /// incarnation of its own (a new job, even if its id was used before).
    pub fn new(info: Vec<u8>, opts: &JobOpts) -> Self {
        Record {
            state: JobState::Pending,
            worker: None,
            priority: opts.priority.unwrap_or(0),
            attempts: 0,
            token: None,
            cancel_requested: false,
            vs: incomplete_vs(0),
            info,
            result: None,
            error: None,
            max_attempts: opts.max_attempts.unwrap_or(MaxAttempts::DEFAULT),
            run_at: None,
            keep: opts.keep.unwrap_or(Keep::Infinity),
            expire_at: None,
            resubmit: None,
            queued_at: None,
            incarnation: Some(new_incarnation()),
            unique: opts.unique.clone(),
            group: opts.group.clone(),
            activity_timeout: opts.activity_timeout,
            run_started_at: None,
            run_ended: None,
        }
    }

    /// The format this record is written in: the oldest that holds it.
    fn format(&self) -> i64 {
        if self.run_started_at.is_some() || self.run_ended.is_some() {
            RECORD_FORMAT_7
        } else if self.group.is_some() || self.activity_timeout.is_some() {
            RECORD_FORMAT_6
        } else if self.unique.is_some() {
            RECORD_FORMAT_5
        } else {
            RECORD_FORMAT
        }
    }

    /// The value for `set_versionstamped_value`: the packed record with an
    /// incomplete versionstamp of `user_version`, plus the placeholder's
    /// 4-byte offset. (Packed as two tuples one after the other, which is
    /// the one tuple of all their elements: the tuple layer's Rust types
    /// stop at twelve elements.)
    pub fn encode(&self, user_version: u16) -> Vec<u8> {
        let format = self.format();
        let mut out = pack_with_versionstamp(&(
            format,
            Bytes::from(self.state.name().as_bytes()),
            self.worker.as_deref().map(Bytes::from),
            self.priority,
            self.attempts,
            self.token.as_ref().map(|t| Bytes::from(&t[..])),
            self.cancel_requested,
            TupleVs::incomplete(user_version),
            Bytes::from(self.info.as_slice()),
            self.result.as_deref().map(Bytes::from),
        ));
        let offset = out.split_off(out.len() - 4);
        let resubmit = self.resubmit.as_ref().map(encode_resubmit);
        out.extend(pack(&(
            self.error.as_deref().map(Bytes::from),
            max_attempts_code(Some(self.max_attempts)),
            self.run_at.map(clamp_i64),
            keep_code(Some(self.keep)),
            self.expire_at.map(clamp_i64),
            resubmit.as_deref().map(Bytes::from),
            self.queued_at.map(clamp_i64),
            self.incarnation.as_ref().map(|i| Bytes::from(&i[..])),
        )));
        match format {
            RECORD_FORMAT_7 => out.extend(pack(&(
                self.unique.as_deref().map(Bytes::from),
                self.group.as_deref().map(Bytes::from),
                activity_timeout_code(self.activity_timeout),
                self.run_started_at.map(clamp_i64),
                self.run_ended.as_ref().map(|r| Bytes::from(r.worker.as_slice())),
                self.run_ended.as_ref().map(|r| clamp_i64(r.ended_at)),
                self.run_ended.as_ref().map(|r| Bytes::from(r.outcome.name().as_bytes())),
            ))),
            RECORD_FORMAT_6 => out.extend(pack(&(
                self.unique.as_deref().map(Bytes::from),
                self.group.as_deref().map(Bytes::from),
                activity_timeout_code(self.activity_timeout),
            ))),
            RECORD_FORMAT_5 => out.extend(pack(&(self.unique.as_deref().map(Bytes::from),))),
            _ => {}
        }
        out.extend(offset);
        out
    }

    /// The record's size as FoundationDB counts it against the value
    /// limit: the versionstamped parameter as given, with its 4-byte
    /// offset (`atomicOp` checks the parameter; the stored value is 4 bytes
    /// shorter). Every size check uses this, so a record refused here is
    /// one the store would refuse, and none it would refuse passes.
    pub fn value_len(&self) -> usize {
        self.encode(0).len()
    }

    /// [`Record::value_len`] of this record as an accept writes it for
    /// `worker`: running, with a token, accepted once more.
    pub fn running_len(&self, worker: &[u8]) -> usize {
        let mut running = self.clone();
        running.state = JobState::Running;
        running.worker = Some(worker.to_vec());
        running.token = Some([0; 16]);
        running.attempts += 1;
        running.cancel_requested = false;
        running.run_at = None;
        running.expire_at = None;
        running.queued_at = None;
        running.run_started_at = Some(u64::MAX);
        running.run_ended = None;
        running.value_len()
    }

    /// [`Record::value_len`] of the widest record this one can become
    /// with no new data from a caller (whose own writes are checked when
    /// they are made): running for a worker whose id adds `worker_len`
    /// bytes to the tuple, with a token; its attempts and `max_attempts`
    /// at their widest encoding (each accept and release moves them); and
    /// the `worker_lost` error that a lost run leaves while it is queued
    /// again, unless the error it has is longer; and its run's start and
    /// end at their widest, the end with the worker's id in it (an ended
    /// run's record holds the id there instead of in `Worker`, and no
    /// token). A record that fits this can always be accepted by a worker
    /// of that id length, and its run ended, again after any run, so it
    /// never sits at the head of its queue unacceptable.
    pub fn largest_len(&self, worker_len: usize) -> usize {
        let mut widest = self.clone();
        widest.state = JobState::Running;
        widest.worker = Some(vec![b'w'; worker_len]);
        widest.token = Some([0; 16]);
        widest.attempts = u64::MAX;
        widest.max_attempts = MaxAttempts::Limit(u64::MAX);
        widest.run_at = None;
        widest.expire_at = None;
        widest.queued_at = None;
        let lost = worker_lost_error();
        if widest.error.as_ref().map_or(0, Vec::len) < lost.len() {
            widest.error = Some(lost);
        }
        widest.run_started_at = Some(u64::MAX);
        widest.run_ended = None;
        let mut ended = widest.clone();
        // Queued again after its run, as widest: scheduled (the longest
        // state name, and both `RunAt` and `QueuedAt`).
        ended.state = JobState::Scheduled;
        ended.worker = None;
        ended.token = None;
        ended.run_at = Some(u64::MAX);
        ended.queued_at = Some(u64::MAX);
        ended.run_ended =
            Some(RunEnded { worker: vec![b'w'; worker_len], ended_at: u64::MAX, outcome: Outcome::LONGEST });
        widest.value_len().max(ended.value_len())
    }

    pub fn decode(value: &[u8]) -> Result<Record, StoreError> {
        let e: Vec<Element> = unpack(value).map_err(|e| corrupt(&e.to_string()))?;
        let len = match e.first().and_then(Element::as_i64) {
            Some(VALUE_FORMAT) => 10,
            Some(RECORD_FORMAT_2) => 16,
            Some(RECORD_FORMAT_3) => 17,
            Some(RECORD_FORMAT) => 18,
            Some(RECORD_FORMAT_5) => 19,
            Some(RECORD_FORMAT_6) => 21,
            Some(RECORD_FORMAT_7) => 25,
            Some(other) => return Err(corrupt(&format!("unknown format {other}"))),
            None => return Err(corrupt("no format version")),
        };
        if e.len() != len {
            return Err(corrupt("element count"));
        }
        let state = bytes(&e[1]).and_then(|s| JobState::from_name(&s)).ok_or_else(|| corrupt("unknown state"))?;
        let token = match opt_bytes(&e[5])? {
            None => None,
            Some(t) => Some(AcceptToken::try_from(&t[..]).map_err(|_| corrupt("token length"))?),
        };
        let vs = e[7].as_versionstamp().ok_or_else(|| corrupt("vs"))?;
        let mut rec = Record {
            state,
            worker: opt_bytes(&e[2])?,
            priority: e[3].as_i64().ok_or_else(|| corrupt("priority"))?,
            attempts: e[4].as_i64().and_then(|a| u64::try_from(a).ok()).ok_or_else(|| corrupt("attempts"))?,
            token,
            cancel_requested: e[6].as_bool().ok_or_else(|| corrupt("cancel_requested"))?,
            vs: *vs.as_bytes(),
            info: bytes(&e[8]).ok_or_else(|| corrupt("info"))?,
            result: opt_bytes(&e[9])?,
            error: None,
            max_attempts: MaxAttempts::DEFAULT,
            run_at: None,
            keep: Keep::Infinity,
            expire_at: None,
            resubmit: None,
            queued_at: None,
            incarnation: None,
            unique: None,
            group: None,
            activity_timeout: None,
            run_started_at: None,
            run_ended: None,
        };
        if len >= 16 {
            rec.error = opt_bytes(&e[10])?;
            rec.max_attempts = max_attempts_from(e[11].as_i64()).ok_or_else(|| corrupt("max_attempts"))?;
            rec.run_at = opt_u64(&e[12])?;
            rec.keep = keep_from(e[13].as_i64()).ok_or_else(|| corrupt("keep"))?;
            rec.expire_at = opt_u64(&e[14])?;
            rec.resubmit = match opt_bytes(&e[15])? {
                None => None,
                Some(r) => Some(decode_resubmit(&r)?),
            };
        }
        if len >= 17 {
            rec.queued_at = opt_u64(&e[16])?;
        }
        if len >= 18 {
            rec.incarnation = match opt_bytes(&e[17])? {
                None => None,
                Some(i) => Some(JobIncarnation::try_from(&i[..]).map_err(|_| corrupt("incarnation length"))?),
            };
        }
        if len == 19 {
            rec.unique = Some(bytes(&e[18]).ok_or_else(|| corrupt("unique"))?);
        }
        if len >= 21 {
            rec.unique = opt_bytes(&e[18])?;
            rec.group = opt_bytes(&e[19])?;
            rec.activity_timeout = match &e[20] {
                Element::Nil => None,
                other => Some(activity_timeout_from(other.as_i64()).ok_or_else(|| corrupt("activity_timeout"))?),
            };
        }
        if len == 25 {
            rec.run_started_at = opt_u64(&e[21])?;
            rec.run_ended = match (opt_bytes(&e[22])?, opt_u64(&e[23])?, opt_bytes(&e[24])?) {
                (None, None, None) => None,
                (Some(worker), Some(ended_at), Some(outcome)) => Some(RunEnded {
                    worker,
                    ended_at,
                    outcome: Outcome::from_name(&outcome).ok_or_else(|| corrupt("run outcome"))?,
                }),
                _ => return Err(corrupt("run end")),
            };
        }
        Ok(rec)
    }

    /// The job this record describes, as the node whose wall clock reads
    /// `now_ms` sees it: a scheduled job that is due is `pending` (it can
    /// be accepted now; the first accept round that sees it moves it).
    pub fn to_job(&self, job_type: &[u8], id: &[u8], now_ms: u64) -> Job {
        let due = self.state == JobState::Scheduled && self.run_at.is_some_and(|t| t <= now_ms);
        Job {
            job_type: job_type.to_vec(),
            id: id.to_vec(),
            state: if due { JobState::Pending } else { self.state },
            worker: self.worker.clone(),
            priority: self.priority,
            info: self.info.clone(),
            result: self.result.clone(),
            attempts: self.attempts,
            cancel_requested: self.cancel_requested,
            vs: self.vs,
            error: self.error.clone(),
            max_attempts: self.max_attempts,
            run_at: if self.state == JobState::Scheduled && !due { self.run_at } else { None },
            keep: self.keep,
            queued_at: self.queued_at,
            incarnation: self.incarnation,
            unique: self.unique.clone(),
            group: self.group.clone(),
            activity_timeout: self.activity_timeout,
        }
    }
}

fn clamp_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn bytes(e: &Element) -> Option<Vec<u8>> {
    e.as_bytes().map(|b| b.to_vec())
}

fn opt_bytes(e: &Element) -> Result<Option<Vec<u8>>, StoreError> {
    match e {
        Element::Nil => Ok(None),
        other => bytes(other).map(Some).ok_or_else(|| corrupt("byte string")),
    }
}

fn opt_u64(e: &Element) -> Result<Option<u64>, StoreError> {
    match e {
        Element::Nil => Ok(None),
        other => other.as_i64().and_then(|v| u64::try_from(v).ok()).map(Some).ok_or_else(|| corrupt("time")),
    }
}

/// `-1`: infinity; `None` (not given) stays nil.
fn max_attempts_code(m: Option<MaxAttempts>) -> Option<i64> {
    m.map(|m| match m {
        MaxAttempts::Limit(n) => clamp_i64(n),
        MaxAttempts::Infinity => -1,
    })
}

fn max_attempts_from(code: Option<i64>) -> Option<MaxAttempts> {
    match code? {
        -1 => Some(MaxAttempts::Infinity),
        n if n > 0 => Some(MaxAttempts::Limit(n as u64)),
        _ => None,
    }
}

/// `-1`: infinity; `None` (the type's) stays nil.
fn activity_timeout_code(t: Option<ActivityTimeout>) -> Option<i64> {
    t.map(|t| match t {
        ActivityTimeout::Seconds(s) => clamp_i64(s),
        ActivityTimeout::Infinity => -1,
    })
}

fn activity_timeout_from(code: Option<i64>) -> Option<ActivityTimeout> {
    match code? {
        -1 => Some(ActivityTimeout::Infinity),
        n if n > 0 => Some(ActivityTimeout::Seconds(n as u64)),
        _ => None,
    }
}

fn keep_code(k: Option<Keep>) -> Option<i64> {
    k.map(|k| match k {
        Keep::Seconds(s) => clamp_i64(s),
        Keep::Infinity => -1,
    })
}

fn keep_from(code: Option<i64>) -> Option<Keep> {
    match code? {
        -1 => Some(Keep::Infinity),
        n if n >= 0 => Some(Keep::Seconds(n as u64)),
        _ => None,
    }
}

/// A resubmission: `(Info, Priority | nil, ScheduleKind, ScheduleMs | nil,
/// MaxAttempts | nil, Keep | nil)`, and `Group | nil, ActivityTimeout |
/// nil` when either is given; `ScheduleKind` 0 none, 1 delay, 2 run_at;
/// nil is "not given".
fn encode_resubmit(r: &Resubmit) -> Vec<u8> {
    let (kind, at) = match r.opts.schedule {
        None => (0i64, None),
        Some(Schedule::Delay(d)) => (1, Some(clamp_i64(d))),
        Some(Schedule::RunAt(t)) => (2, Some(clamp_i64(t))),
    };
    let mut out = pack(&(
        Bytes::from(r.info.as_slice()),
        r.opts.priority,
        kind,
        at,
        max_attempts_code(r.opts.max_attempts),
        keep_code(r.opts.keep),
    ));
    if r.opts.group.is_some() || r.opts.activity_timeout.is_some() {
        out.extend(pack(&(r.opts.group.as_deref().map(Bytes::from), activity_timeout_code(r.opts.activity_timeout))));
    }
    out
}

fn decode_resubmit(v: &[u8]) -> Result<Resubmit, StoreError> {
    let e: Vec<Element> = unpack(v).map_err(|e| corrupt(&e.to_string()))?;
    if e.len() != 6 && e.len() != 8 {
        return Err(corrupt("resubmit element count"));
    }
    let info = bytes(&e[0]).ok_or_else(|| corrupt("resubmit info"))?;
    let opt_i64 = |e: &Element| match e {
        Element::Nil => Ok(None),
        other => other.as_i64().map(Some).ok_or_else(|| corrupt("resubmit integer")),
    };
    let priority = opt_i64(&e[1])?;
    let kind = e[2].as_i64().ok_or_else(|| corrupt("resubmit schedule"))?;
    let at = opt_i64(&e[3])?;
    let max_attempts = opt_i64(&e[4])?;
    let keep = opt_i64(&e[5])?;
    let (group, activity_timeout) = match e.get(6..8) {
        Some([g, t]) => (
            opt_bytes(g)?,
            match opt_i64(t)? {
                None => None,
                code => Some(activity_timeout_from(code).ok_or_else(|| corrupt("resubmit activity_timeout"))?),
            },
        ),
        _ => (None, None),
    };
    let at = at.and_then(|t| u64::try_from(t).ok());
    let schedule = match (kind, at) {
        (0, _) => None,
        (1, Some(d)) => Some(Schedule::Delay(d)),
        (2, Some(t)) => Some(Schedule::RunAt(t)),
        _ => return Err(corrupt("resubmit schedule")),
    };
    let max_attempts = match max_attempts {
        None => None,
        code => Some(max_attempts_from(code).ok_or_else(|| corrupt("resubmit max_attempts"))?),
    };
    let keep = match keep {
        None => None,
        code => Some(keep_from(code).ok_or_else(|| corrupt("resubmit keep"))?),
    };
    Ok(Resubmit { info, opts: JobOpts { priority, schedule, max_attempts, keep, unique: None, group, activity_timeout } })
}

mod markers;

pub(crate) use markers::{decode_active, decode_orphan_marker, decode_orphan_removals, encode_active, encode_orphan_marker, Removal};

#[cfg(test)]
mod tests;
