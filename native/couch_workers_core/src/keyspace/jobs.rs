//! The job queue's keys (`jobs/`): records, the indexes, the counters and
//! watch keys of a job type, type settings, unique keys and run history.
//! Described in `docs/keyspace.md`.

use super::*;

impl Keyspace {
    // ---- jobs ---------------------------------------------------------

    /// `("couch_workers", "jobs", JobType, JobId)`
    pub fn job(&self, job_type: &[u8], job_id: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(JOBS), b(job_type), b(job_id)))
    }

    /// Every job record of one type.
    pub fn jobs_range(&self, job_type: &[u8]) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.root.pack(&(b(JOBS), b(job_type))))
    }

    /// `("couch_workers", "pending", JobType, Priority, VS, JobId)` with an
    /// incomplete versionstamp, for `set_versionstamped_key` (FIFO within a
    /// priority by commit order; `user_version` orders jobs added in one
    /// transaction).
    pub fn pending_new(&self, job_type: &[u8], priority: i64, user_version: u16, job_id: &[u8]) -> Vec<u8> {
        self.root.pack_with_versionstamp(&(
            b(PENDING),
            b(job_type),
            priority,
            TupleVersionstamp::incomplete(user_version),
            b(job_id),
        ))
    }

    /// The pending key of a job whose pending versionstamp is known.
    pub fn pending(&self, job_type: &[u8], priority: i64, vs: &[u8; 12], job_id: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(PENDING), b(job_type), priority, TupleVersionstamp::from(*vs), b(job_id)))
    }

    /// Every pending key of one type, in run order.
    pub fn pending_range(&self, job_type: &[u8]) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.root.pack(&(b(PENDING), b(job_type))))
    }

    /// Decodes a pending key: `(priority, 12-byte VS, job id)`.
    pub fn parse_pending(&self, job_type: &[u8], key: &[u8]) -> Option<(i64, [u8; 12], Vec<u8>)> {
        let rest = key.strip_prefix(self.root.bytes())?;
        let (p, t, prio, vs, id) = unpack::<(Bytes, Bytes, i64, TupleVersionstamp, Bytes)>(rest).ok()?;
        (&*p == PENDING && &*t == job_type).then(|| (prio, *vs.as_bytes(), id.into_owned()))
    }

    /// `("couch_workers", "active", WorkerType, Worker, JobId)`
    pub fn active(&self, worker_type: &[u8], worker: &[u8], job_id: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(ACTIVE), b(worker_type), b(worker), b(job_id)))
    }

    /// Every active key of one worker.
    pub fn active_range(&self, worker_type: &[u8], worker: &[u8]) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.root.pack(&(b(ACTIVE), b(worker_type), b(worker))))
    }

    /// Decodes an active key's job id.
    pub fn parse_active_job_id(&self, worker_type: &[u8], worker: &[u8], key: &[u8]) -> Option<Vec<u8>> {
        let rest = key.strip_prefix(self.root.bytes())?;
        let (a, t, w, id) = unpack::<(Bytes, Bytes, Bytes, Bytes)>(rest).ok()?;
        (&*a == ACTIVE && &*t == worker_type && &*w == worker).then(|| id.into_owned())
    }

    /// `("couch_workers", "counts", JobType, "pending")`: exact pending count.
    pub fn pending_count(&self, job_type: &[u8]) -> Vec<u8> {
        self.state_count(job_type, PENDING)
    }

    /// `("couch_workers", "counts", JobType, State)`: how many jobs of the
    /// type are in `state` (a state name), kept by atomic adds in every
    /// transaction that moves a job.
    pub fn state_count(&self, job_type: &[u8], state: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(COUNTS), b(job_type), b(state)))
    }

    /// `("couch_workers", "scheduled", JobType, RunAt, JobId)`: a scheduled
    /// job, by the Unix ms it falls due.
    pub fn scheduled(&self, job_type: &[u8], run_at: i64, job_id: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(SCHEDULED), b(job_type), run_at, b(job_id)))
    }

    /// Every scheduled key of one type, earliest first.
    pub fn scheduled_range(&self, job_type: &[u8]) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.root.pack(&(b(SCHEDULED), b(job_type))))
    }

    /// The first scheduled key of the type due after `run_at`: the keys
    /// before it (from the range's start) are due at or before `run_at`.
    pub fn scheduled_after(&self, job_type: &[u8], run_at: i64) -> Vec<u8> {
        match run_at.checked_add(1) {
            Some(next) => self.root.pack(&(b(SCHEDULED), b(job_type), next)),
            None => self.scheduled_range(job_type).1,
        }
    }

    /// Decodes a scheduled key: `(run_at, job id)`.
    pub fn parse_scheduled(&self, job_type: &[u8], key: &[u8]) -> Option<(i64, Vec<u8>)> {
        let rest = key.strip_prefix(self.root.bytes())?;
        let (s, t, at, id) = unpack::<(Bytes, Bytes, i64, Bytes)>(rest).ok()?;
        (&*s == SCHEDULED && &*t == job_type).then(|| (at, id.into_owned()))
    }

    /// `("couch_workers", "by_state", JobType, State, JobId)`: the index
    /// of one state's jobs in id order.
    pub fn by_state(&self, job_type: &[u8], state: &[u8], job_id: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(BY_STATE), b(job_type), b(state), b(job_id)))
    }

    /// Every index key of one state of a type.
    pub fn by_state_range(&self, job_type: &[u8], state: &[u8]) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.root.pack(&(b(BY_STATE), b(job_type), b(state))))
    }

    /// Decodes an index key's job id.
    pub fn parse_by_state(&self, job_type: &[u8], state: &[u8], key: &[u8]) -> Option<Vec<u8>> {
        let rest = key.strip_prefix(self.root.bytes())?;
        let (i, t, s, id) = unpack::<(Bytes, Bytes, Bytes, Bytes)>(rest).ok()?;
        (&*i == BY_STATE && &*t == job_type && &*s == state).then(|| id.into_owned())
    }

    /// Decodes a job record key's id.
    pub fn parse_job(&self, job_type: &[u8], key: &[u8]) -> Option<Vec<u8>> {
        let rest = key.strip_prefix(self.root.bytes())?;
        let (j, t, id) = unpack::<(Bytes, Bytes, Bytes)>(rest).ok()?;
        (&*j == JOBS && &*t == job_type).then(|| id.into_owned())
    }

    /// `("couch_workers", "types", JobType)`: how many jobs the type has.
    pub fn job_type_count(&self, job_type: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(TYPES), b(job_type)))
    }

    /// Every job type count.
    pub fn job_types_range(&self) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.root.pack(&(b(TYPES),)))
    }

    /// Decodes a job type count's key.
    pub fn parse_job_type(&self, key: &[u8]) -> Option<Vec<u8>> {
        let rest = key.strip_prefix(self.root.bytes())?;
        let (t, ty) = unpack::<(Bytes, Bytes)>(rest).ok()?;
        (&*t == TYPES).then(|| ty.into_owned())
    }

    /// `("couch_workers", "expiry", ExpireAt, JobType, JobId)`: an ended
    /// job to prune at `expire_at` (Unix ms).
    pub fn expiry(&self, expire_at: i64, job_type: &[u8], job_id: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(EXPIRY), expire_at, b(job_type), b(job_id)))
    }

    /// Every expiry key, earliest first.
    pub fn expiry_range(&self) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.root.pack(&(b(EXPIRY),)))
    }

    /// The first expiry key after every one due at or before `at`.
    pub fn expiry_after(&self, at: i64) -> Vec<u8> {
        match at.checked_add(1) {
            Some(next) => self.root.pack(&(b(EXPIRY), next)),
            None => self.expiry_range().1,
        }
    }

    /// Decodes an expiry key: `(expire_at, job type, job id)`.
    pub fn parse_expiry(&self, key: &[u8]) -> Option<(i64, Vec<u8>, Vec<u8>)> {
        let rest = key.strip_prefix(self.root.bytes())?;
        let (e, at, t, id) = unpack::<(Bytes, i64, Bytes, Bytes)>(rest).ok()?;
        (&*e == EXPIRY).then(|| (at, t.into_owned(), id.into_owned()))
    }

    /// `("couch_workers", "paused", JobType)`: present while the type is
    /// paused.
    pub fn paused(&self, job_type: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(PAUSED), b(job_type)))
    }

    /// `("couch_workers", "jobs_vs", JobType)`: each node's dispatcher of
    /// the type watches it.
    pub fn jobs_vs(&self, job_type: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(JOBS_VS), b(job_type)))
    }

    /// `("couch_workers", "orphans", WorkerType, Worker)`: the worker was
    /// removed while more running jobs remained than one transaction may
    /// requeue; the sweeper requeues the rest.
    pub fn orphan(&self, worker_type: &[u8], worker: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(ORPHANS), b(worker_type), b(worker)))
    }

    /// Every orphan marker.
    pub fn orphans_range(&self) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.root.pack(&(b(ORPHANS),)))
    }

    /// Decodes an orphan marker's key: `(worker type, worker)`.
    pub fn parse_orphan(&self, key: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
        let rest = key.strip_prefix(self.root.bytes())?;
        let (o, t, w) = unpack::<(Bytes, Bytes, Bytes)>(rest).ok()?;
        (&*o == ORPHANS).then(|| (t.into_owned(), w.into_owned()))
    }

    /// `("couch_workers", "orphans_vs")`: bumped whenever an orphan marker
    /// is written; each node's sweeper watches it.
    pub fn orphans_vs(&self) -> Vec<u8> {
        self.root.pack(&(b(ORPHANS_VS),))
    }
}

// ---- job type settings ------------------------------------------------------

impl Keyspace {
    /// `("couch_workers", "type_settings", JobType)`: the type's settings
    /// (`jobs/type_settings.rs`), absent until first set.
    pub fn type_settings(&self, job_type: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(TYPE_SETTINGS), b(job_type)))
    }
}

impl Keyspace {
    /// Every type's settings key (the activity observer reads them all).
    pub fn type_settings_range(&self) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.root.pack(&(b(TYPE_SETTINGS),)))
    }

    /// Decodes a type settings key's job type.
    pub fn parse_type_settings(&self, key: &[u8]) -> Option<Vec<u8>> {
        let rest = key.strip_prefix(self.root.bytes())?;
        let (s, t) = unpack::<(Bytes, Bytes)>(rest).ok()?;
        (&*s == TYPE_SETTINGS).then(|| t.into_owned())
    }
}

const TYPE_SETTINGS: &[u8] = b"type_settings";

// ---- running limits ---------------------------------------------------------

impl Keyspace {
    /// `("couch_workers", "group_running", JobType, Group)`: how many jobs
    /// of the type's group `Group` are running (little-endian i64, atomic
    /// adds in the transactions that move a grouped job into or out of
    /// `running`; `jobs/limits.rs`), read by accepts under a
    /// `max_running_per_group`.
    pub fn group_running(&self, job_type: &[u8], group: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(GROUP_RUNNING), b(job_type), b(group)))
    }

    /// Every group's running counter, of every type (the pruner clears
    /// those back at 0: `jobs/ops/prune.rs`).
    pub fn group_running_range(&self) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.root.pack(&(b(GROUP_RUNNING),)))
    }
}

const GROUP_RUNNING: &[u8] = b"group_running";

// ---- unique keys ------------------------------------------------------------

impl Keyspace {
    /// `("couch_workers", "unique", JobType, Key)`: the id of the
    /// scheduled, pending or running job of the type that holds `Key`
    /// (`jobs/ops/unique.rs`).
    pub fn unique(&self, job_type: &[u8], key: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(UNIQUE), b(job_type), b(key)))
    }
}

const UNIQUE: &[u8] = b"unique";

// ---- run history ------------------------------------------------------------

impl Keyspace {
    /// `("couch_workers", "history", JobType, JobId, Run, Part)`: one
    /// part of the job's run `Run` (its attempt number): `0` its start,
    /// `1` its end (`jobs/history.rs`).
    pub fn history_part(&self, job_type: &[u8], job_id: &[u8], run: i64, part: i64) -> Vec<u8> {
        self.root.pack(&(b(HISTORY), b(job_type), b(job_id), run, part))
    }

    /// The first key of run `run` of the job's history: the runs before
    /// it lie between the history's range start and this key.
    pub fn history_run(&self, job_type: &[u8], job_id: &[u8], run: i64) -> Vec<u8> {
        self.root.pack(&(b(HISTORY), b(job_type), b(job_id), run))
    }

    /// Every history key of one job, oldest run first.
    pub fn history_range(&self, job_type: &[u8], job_id: &[u8]) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.root.pack(&(b(HISTORY), b(job_type), b(job_id))))
    }

    /// Decodes a history key of the job: `(run, part)`.
    pub fn parse_history(&self, job_type: &[u8], job_id: &[u8], key: &[u8]) -> Option<(i64, i64)> {
        let rest = key.strip_prefix(self.root.bytes())?;
        let (h, t, id, run, part) = unpack::<(Bytes, Bytes, Bytes, i64, i64)>(rest).ok()?;
        (&*h == HISTORY && &*t == job_type && &*id == job_id).then_some((run, part))
    }
}

const HISTORY: &[u8] = b"history";
