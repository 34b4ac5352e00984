//! The index of running jobs by their last change, for activity timeouts
//! (`jobs/activity.rs` keeps it, `services/activity/` reads it).
//! Described in `docs/keyspace.md` ("activity").

use std::collections::HashMap;
use std::sync::RwLock;

use super::*;

const ACTIVITY: &[u8] = b"activity";
const ACTIVITY_VS: &[u8] = b"activity_vs";

/// One index key, decoded: `(job type, timeout s, 12-byte VS, job id)`.
pub type ActivityEntry = (Vec<u8>, i64, [u8; 12], Vec<u8>);

impl Keyspace {
    /// `("couch_workers", "activity", JobType, TimeoutS, VS, JobId)` with
    /// an incomplete versionstamp, for `set_versionstamped_key`: written
    /// with the job's record, in the same commit and with the same user
    /// version, so that its VS is the record's `vs`.
    pub fn activity_new(&self, job_type: &[u8], timeout_s: i64, user_version: u16, job_id: &[u8]) -> Vec<u8> {
        self.root.pack_with_versionstamp(&(
            b(ACTIVITY),
            b(job_type),
            timeout_s,
            TupleVersionstamp::incomplete(user_version),
            b(job_id),
        ))
    }

    /// The index key of a job whose record's `vs` is known.
    pub fn activity(&self, job_type: &[u8], timeout_s: i64, vs: &[u8; 12], job_id: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(ACTIVITY), b(job_type), timeout_s, TupleVersionstamp::from(*vs), b(job_id)))
    }

    /// `("couch_workers", "activity_vs")`: VS of the last accept that
    /// wrote an index key; an activity observer that found the index
    /// empty watches it.
    pub fn activity_vs(&self) -> Vec<u8> {
        self.root.pack(&(b(ACTIVITY_VS),))
    }

    /// Every index key.
    pub fn activity_range(&self) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.root.pack(&(b(ACTIVITY),)))
    }

    /// The index keys of one type and timeout, oldest change first.
    pub fn activity_bucket_range(&self, job_type: &[u8], timeout_s: i64) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.root.pack(&(b(ACTIVITY), b(job_type), timeout_s)))
    }

    /// The first key of the bucket `(job_type, timeout_s)` whose change is
    /// after commit version `version`: the keys before it (from the
    /// bucket's start) changed at or before `version`.
    pub fn activity_after(&self, job_type: &[u8], timeout_s: i64, version: u64) -> Vec<u8> {
        let mut vs = [0xffu8; 12];
        vs[..8].copy_from_slice(&version.to_be_bytes());
        let mut key = self.root.pack(&(b(ACTIVITY), b(job_type), timeout_s, TupleVersionstamp::from(vs)));
        // Past every job id of that versionstamp.
        key.push(0xff);
        key
    }

    /// Decodes an index key.
    pub fn parse_activity(&self, key: &[u8]) -> Option<ActivityEntry> {
        let rest = key.strip_prefix(self.root.bytes())?;
        let (a, t, timeout, vs, id) = unpack::<(Bytes, Bytes, i64, TupleVersionstamp, Bytes)>(rest).ok()?;
        (&*a == ACTIVITY).then(|| (t.into_owned(), timeout, *vs.as_bytes(), id.into_owned()))
    }
}

/// The default activity timeouts (seconds) of the job types whose
/// `activity_timeout` setting is finite, as this node's activity observer
/// last read them (at each of its passes, and when a change of the
/// setting wakes it). A job with no timeout of its own is indexed by it
/// at its accept and at each change of its record: a node that has not
/// read a change yet indexes by the value before (`docs/api.md`,
/// "Activity timeouts").
#[derive(Debug, Default)]
pub struct TypeTimeouts {
    by_type: RwLock<HashMap<Vec<u8>, i64>>,
}

impl TypeTimeouts {
    /// The type's default timeout, if it has a finite one.
    pub fn get(&self, job_type: &[u8]) -> Option<i64> {
        self.by_type.read().unwrap_or_else(|p| p.into_inner()).get(job_type).copied()
    }

    /// Whether no type has a default timeout.
    pub fn is_empty(&self) -> bool {
        self.by_type.read().unwrap_or_else(|p| p.into_inner()).is_empty()
    }

    /// Replaces every type's value with what was read.
    pub fn set_all(&self, by_type: HashMap<Vec<u8>, i64>) {
        *self.by_type.write().unwrap_or_else(|p| p.into_inner()) = by_type;
    }
}

impl Keyspace {
    /// The job types' default activity timeouts this node knows of.
    pub fn type_timeouts(&self) -> &TypeTimeouts {
        &self.type_timeouts
    }
}
