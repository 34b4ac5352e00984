//! The recurring jobs' keys (`schedules/`), described in
//! `docs/keyspace.md`.

use super::*;

// ---- recurring jobs (`schedules/`) -------------------------------------------

impl Keyspace {
    /// `("couch_workers", "schedules", JobType, ScheduleId)`: a recurring
    /// job's record.
    pub fn schedule(&self, job_type: &[u8], schedule_id: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(SCHEDULES), b(job_type), b(schedule_id)))
    }

    /// Every schedule record of one job type, in id order.
    pub fn schedules_range(&self, job_type: &[u8]) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.root.pack(&(b(SCHEDULES), b(job_type))))
    }

    /// The schedule id of a record key of `job_type`.
    pub fn parse_schedule(&self, job_type: &[u8], key: &[u8]) -> Option<Vec<u8>> {
        let rest = key.strip_prefix(self.root.bytes())?;
        let (s, t, id) = unpack::<(Bytes, Bytes, Bytes)>(rest).ok()?;
        (&*s == SCHEDULES && &*t == job_type).then(|| id.into_owned())
    }

    /// Every schedule record key, of every job type.
    pub fn all_schedules_range(&self) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.root.pack(&(b(SCHEDULES),)))
    }

    /// The job type of a schedule record key; `None` for any other key.
    pub fn schedule_type_of(&self, key: &[u8]) -> Option<Vec<u8>> {
        let rest = key.strip_prefix(self.root.bytes())?;
        let (s, t, _id) = unpack::<(Bytes, Bytes, Bytes)>(rest).ok()?;
        (&*s == SCHEDULES).then(|| t.into_owned())
    }

    /// `("couch_workers", "schedule_due", NextRunAt, JobType, ScheduleId)`:
    /// a schedule by the Unix ms of its next due slot, across every type,
    /// so that a node's runner reads one first key to know when to wake.
    pub fn schedule_due(&self, next_run_at: i64, job_type: &[u8], schedule_id: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(SCHEDULE_DUE), next_run_at, b(job_type), b(schedule_id)))
    }

    /// Every due key.
    pub fn schedule_due_range(&self) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.root.pack(&(b(SCHEDULE_DUE),)))
    }

    /// The first due key after every slot at or before `at`.
    pub fn schedule_due_after(&self, at: i64) -> Vec<u8> {
        // (at + 1,) sorts before every key of `at + 1` and after all of `at`.
        self.root.pack(&(b(SCHEDULE_DUE), at.saturating_add(1)))
    }

    /// Decodes a due key: `(next_run_at, job type, schedule id)`.
    pub fn parse_schedule_due(&self, key: &[u8]) -> Option<(i64, Vec<u8>, Vec<u8>)> {
        let rest = key.strip_prefix(self.root.bytes())?;
        let (d, at, t, id) = unpack::<(Bytes, i64, Bytes, Bytes)>(rest).ok()?;
        (&*d == SCHEDULE_DUE).then(|| (at, t.into_owned(), id.into_owned()))
    }

    /// `("couch_workers", "schedules_vs")`: the versionstamp of the last
    /// transaction that set or removed a schedule. Every node's runner
    /// watches it, so that a schedule due before its wake-up is seen.
    pub fn schedules_vs(&self) -> Vec<u8> {
        self.root.pack(&(b(SCHEDULES_VS),))
    }
}
