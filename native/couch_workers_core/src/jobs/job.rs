//! The job as the API returns it, the handle of one accept, and the
//! inputs and outcomes of the calls that have no better home.

use crate::error::Error;

/// A job's versionstamp as returned: the 10-byte commit versionstamp of
/// the job's last change plus the 2-byte user version that ordered it
/// within that commit. Byte order is change order: a later change of the
/// same job compares greater.
pub type JobVs = [u8; 12];

/// The fencing token of one accept: 16 random bytes, new at every accept.
pub type AcceptToken = [u8; 16];

/// The state of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobState {
    Pending,
    Running,
    Finished,
    Canceled,
}

impl JobState {
    /// The name stored in the record and returned to Erlang as an atom.
    pub fn name(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Running => "running",
            JobState::Finished => "finished",
            JobState::Canceled => "canceled",
        }
    }

    pub fn from_name(name: &[u8]) -> Option<Self> {
        match name {
            b"pending" => Some(JobState::Pending),
            b"running" => Some(JobState::Running),
            b"finished" => Some(JobState::Finished),
            b"canceled" => Some(JobState::Canceled),
            _ => None,
        }
    }
}

/// A job as `get`, `accept`, `update` and subscriptions return it. The NIF
/// turns it into the Erlang map of DESIGN.md (`type`, `id`, `state`,
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
}

/// What `accept` and `update` return: the job and the token of the accept
/// that took it. `update`/`finish` take its [`Fence`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobHandle {
    pub job: Job,
    pub token: AcceptToken,
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

/// A change of a subscribed job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEvent {
    /// The job changed (its versionstamp grew); the job as it is now.
    Changed(Job),
    /// The job was removed; the subscription has ended.
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
