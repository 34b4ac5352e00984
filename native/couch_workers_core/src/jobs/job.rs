//! The job as the API returns it, the handle of one accept, and the
//! inputs and outcomes of the calls that have no better home.

use crate::error::Error;

/// A job's versionstamp as returned: the 10-byte commit versionstamp of
/// the job's last change plus the 2-byte user version that ordered it
/// within that commit. Byte order is change order: a later change of the
/// same job compares greater.
pub type JobVs = [u8; 12];

/// Which job of its id a record is: 8 random non-zero bytes drawn when
/// the job is added and kept by every other write of it. A job removed
/// and added again with the same id has another, which tells it from a
/// later version of the first (its `vs` grows either way). Two draws are
/// equal with probability 255^-8 (below 10^-19): a subscriber would take
/// the new job for its own (as with a record written before
/// incarnations), no worse.
pub type JobIncarnation = [u8; 8];

/// The fencing token of one accept: 16 random bytes, new at every accept.
pub type AcceptToken = [u8; 16];

/// The state of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobState {
    /// Waiting for its `run_at`; then pending.
    Scheduled,
    Pending,
    Running,
    Finished,
    Canceled,
    /// Its attempts were spent, or a failure asked for no retry.
    Failed,
}

impl JobState {
    /// The name stored in the record and returned to Erlang as an atom.
    pub fn name(self) -> &'static str {
        match self {
            JobState::Scheduled => "scheduled",
            JobState::Pending => "pending",
            JobState::Running => "running",
            JobState::Finished => "finished",
            JobState::Canceled => "canceled",
            JobState::Failed => "failed",
        }
    }

    pub fn from_name(name: &[u8]) -> Option<Self> {
        match name {
            b"scheduled" => Some(JobState::Scheduled),
            b"pending" => Some(JobState::Pending),
            b"running" => Some(JobState::Running),
            b"finished" => Some(JobState::Finished),
            b"canceled" => Some(JobState::Canceled),
            b"failed" => Some(JobState::Failed),
            _ => None,
        }
    }

    /// Every state, in the order `job_counts` lists them.
    pub const ALL: [JobState; 6] = [
        JobState::Scheduled,
        JobState::Pending,
        JobState::Running,
        JobState::Finished,
        JobState::Canceled,
        JobState::Failed,
    ];

    /// A state a job ends in: its `keep` runs from here.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Finished | JobState::Canceled | JobState::Failed)
    }
}

/// `max_attempts`: how many accepts a job may have before a failure ends
/// it as `failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxAttempts {
    Limit(u64),
    Infinity,
}

impl MaxAttempts {
    pub const DEFAULT: MaxAttempts = MaxAttempts::Limit(20);

    /// Whether a job accepted `attempts` times may run again after a
    /// failure.
    pub fn allows_retry(self, attempts: u64) -> bool {
        match self {
            MaxAttempts::Limit(n) => attempts < n,
            MaxAttempts::Infinity => true,
        }
    }

    /// One more (a release does not bring a job closer to `failed`).
    pub fn raised(self) -> MaxAttempts {
        match self {
            MaxAttempts::Limit(n) => MaxAttempts::Limit(n.saturating_add(1)),
            MaxAttempts::Infinity => MaxAttempts::Infinity,
        }
    }
}

/// `keep`: how long a job stays once it ended (finished, canceled,
/// failed), in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    Seconds(u64),
    Infinity,
}

/// When a queued job may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// This many ms after the write, on the writing node's wall clock.
    Delay(u64),
    /// At this Unix time in ms.
    RunAt(u64),
}

impl Schedule {
    /// The Unix ms the job falls due, given the writer's wall clock.
    pub fn run_at(self, now_ms: u64) -> u64 {
        match self {
            Schedule::Delay(d) => now_ms.saturating_add(d),
            Schedule::RunAt(t) => t,
        }
    }
}

/// The options of `add`, `resubmit` and `release`; `None` is "not given"
/// (for `add`: the default; for `resubmit`: keep the job's value).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JobOpts {
    pub priority: Option<i64>,
    pub schedule: Option<Schedule>,
    pub max_attempts: Option<MaxAttempts>,
    pub keep: Option<Keep>,
    /// The job's unique key (`add`, `resubmit`; a release ignores it):
    /// while the job is scheduled, pending or running, no other job of
    /// its type may hold it (`jobs/ops/unique.rs`).
    pub unique: Option<Vec<u8>>,
    /// The job's group, for its type's `max_running_per_group`.
    pub group: Option<Vec<u8>>,
    /// How long the job may run without a change of its record; `None`:
    /// its type's `activity_timeout`.
    pub activity_timeout: Option<ActivityTimeout>,
}

/// A job's own activity timeout (the job option `activity_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActivityTimeout {
    /// Never taken back for want of activity, whatever its type says.
    Infinity,
    /// Taken back after this many seconds without a change of its record.
    Seconds(u64),
}

impl JobOpts {
    /// Only a priority (the older calls).
    pub fn priority(priority: i64) -> JobOpts {
        JobOpts { priority: Some(priority), ..JobOpts::default() }
    }
}

/// A job as `get`, `accept`, `update` and subscriptions return it. The NIF
/// turns it into the Erlang job map (docs/api.md: `type`, `id`, `state`,
/// `worker`, `priority`, `info`, `result`, `attempts`, `vs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub job_type: Vec<u8>,
    pub id: Vec<u8>,
    pub state: JobState,
    /// The worker running it; `None` unless `state` is `Running`.
    pub worker: Option<Vec<u8>>,
    pub priority: i64,
    /// The info, a JSON object.
    pub info: Vec<u8>,
    /// The result, a JSON object, once finished.
    pub result: Option<Vec<u8>>,
    /// How many times the job has been accepted (+1 at each accept).
    pub attempts: u64,
    /// A cancel was requested while it ran: its worker's next update
    /// cancels it.
    pub cancel_requested: bool,
    pub vs: JobVs,
    /// The last failure's error, a JSON object (`None` until a failure).
    pub error: Option<Vec<u8>>,
    pub max_attempts: MaxAttempts,
    /// Unix ms when a scheduled job falls due (`None` unless scheduled).
    pub run_at: Option<u64>,
    pub keep: Keep,
    /// Unix ms since which it can be accepted (the writer's wall clock):
    /// set while pending or scheduled, else `None`.
    pub queued_at: Option<u64>,
    /// Drawn when the job was added, kept by its other writes
    /// ([`JobIncarnation`]); `None` for a job added before records carried
    /// it (format 3 and older), taken to be the same job throughout.
    pub incarnation: Option<JobIncarnation>,
    /// Its unique key, if it was given one.
    pub unique: Option<Vec<u8>>,
    /// Its group, if it was given one.
    pub group: Option<Vec<u8>>,
    /// Its own activity timeout; `None`: its type's.
    pub activity_timeout: Option<ActivityTimeout>,
}

/// What `accept` and `update` return: the job and the token of the accept
/// that took it. `update`/`finish` take its [`Fence`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobHandle {
    pub job: Job,
    pub token: AcceptToken,
    /// In the handle of the accept that took the job: the job's
    /// `queued_at` just before (how long it waited, the telemetry's
    /// `queue_time`); `None` in the handles of updates, and of an accept
    /// that answers from its own landed commit found again.
    pub queued_at: Option<u64>,
}

impl JobHandle {
    /// What `update` and `finish` check the record against.
    pub fn fence(&self) -> Fence {
        Fence {
            job_type: self.job.job_type.clone(),
            job_id: self.job.id.clone(),
            worker: self.job.worker.clone().unwrap_or_default(),
            token: self.token,
        }
    }
}

/// The part of a handle that `update` and `finish` need: which job, which
/// worker (of the job's type) took it, and the token of that accept. The
/// NIF rebuilds it from the handle map it gave out.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fence {
    pub job_type: Vec<u8>,
    pub job_id: Vec<u8>,
    pub worker: Vec<u8>,
    pub token: AcceptToken,
}

/// One job of `add_many`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewJob {
    pub id: Vec<u8>,
    /// A JSON object.
    pub info: Vec<u8>,
    pub priority: i64,
}

/// One job to add with every option of `job_add/4`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSpec {
    pub id: Vec<u8>,
    /// A JSON object.
    pub info: Vec<u8>,
    pub opts: JobOpts,
}

impl From<&NewJob> for JobSpec {
    fn from(job: &NewJob) -> JobSpec {
        JobSpec { id: job.id.clone(), info: job.info.clone(), opts: JobOpts::priority(job.priority) }
    }
}

/// A change of a subscribed job. (`Changed` is the common case; boxing it
/// would cost an allocation per event to save stack on the rare one.)
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEvent {
    /// The job changed (its versionstamp grew); the job as it is now.
    Changed(Job),
    /// The job was removed (also when another job of the same id was
    /// added after it between two reads of the watcher: its incarnation
    /// differs); the subscription has ended.
    Removed,
}

/// Why `add_many` added nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddManyError {
    /// These ids exist already (or appear twice in the batch: the second
    /// one would find the first).
    #[error("already exists: {} ids", .0.len())]
    AlreadyExists(Vec<Vec<u8>>),
    #[error(transparent)]
    Error(#[from] Error),
}

impl AddManyError {
    /// The atom of `{error, Atom}` (`already_exists` comes with its ids).
    pub fn name(&self) -> &'static str {
        match self {
            AddManyError::AlreadyExists(_) => "already_exists",
            AddManyError::Error(e) => e.name(),
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Not ended yet.
    Running,
    Finished,
    /// Failed, with no retry left (or none asked for).
    Failed,
    /// Failed, and queued to be tried again.
    Retried,
    /// Given back (`release`, an unregister).
    Released,
    /// Its worker died (reaped, replaced, its owner exited).
    Lost,
    Canceled,
    /// Taken back from its worker: its record did not change for its
    /// activity timeout (`jobs/activity.rs`), whether it was queued again
    /// or, its attempts spent, failed.
    Timeout,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Running => "running",
            Outcome::Finished => "finished",
            Outcome::Failed => "failed",
            Outcome::Retried => "retried",
            Outcome::Released => "released",
            Outcome::Lost => "lost",
            Outcome::Canceled => "canceled",
            Outcome::Timeout => "timeout",
        }
    }

    /// The widest of the names (for the record's size bounds).
    pub(crate) const LONGEST: Outcome = Outcome::Released;

    /// Whether the run failed: its error is the record's.
    pub(crate) fn is_failure(self) -> bool {
        matches!(self, Outcome::Failed | Outcome::Retried | Outcome::Lost | Outcome::Timeout)
    }

    pub(crate) fn from_name(name: &[u8]) -> Option<Outcome> {
        [
            Outcome::Running,
            Outcome::Finished,
            Outcome::Failed,
            Outcome::Retried,
            Outcome::Released,
            Outcome::Lost,
            Outcome::Canceled,
            Outcome::Timeout,
        ]
        .into_iter()
        .find(|o| o.name().as_bytes() == name)
    }
}
