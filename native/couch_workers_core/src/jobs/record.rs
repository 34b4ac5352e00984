//! The stored values of the job queue, versioned.
//!
//! Job record, at `("couch_workers", "jobs", JobType, JobId)`, format 1:
//!
//! ```text
//! (1, State, Worker | nil, Priority, Attempts, Token | nil, CancelRequested, VS, Info, Result | nil)
//! ```
//!
//! a tuple-layer packed tuple: `1` the format version (an integer; a
//! reader that meets another one refuses the record rather than guess),
//! `State` the byte string `pending | running | finished | canceled`,
//! `Worker` the byte string of the worker running it (nil unless running),
//! `Priority` an integer, `Attempts` an integer (accepts so far), `Token`
//! the 16-byte accept token of the running accept (nil unless running),
//! `CancelRequested` a boolean, `VS` a tuple versionstamp (`0x33`, 12
//! bytes) and `Info`/`Result` byte strings holding JSON objects. Ids and
//! worker ids are byte strings, so any binary (NUL bytes, not UTF-8) is
//! kept as it is.
//!
//! `VS` is written with `set_versionstamped_value`: every write of a
//! record stamps it with the commit's versionstamp and a user version. A
//! write that makes a job pending uses the same user version for the
//! record and for its pending key `(…, Priority, VS, JobId)`, so while a
//! job is pending its record's VS *is* its pending key's VS, and the
//! pending key is found from the record (cancel, remove).
//!
//! Active value, at `("couch_workers", "active", WorkerType, Worker, JobId)`,
//! format 1: `(1, AcceptVS)`, the tuple versionstamp of the accept that
//! made the job running (also written with `set_versionstamped_value`).
//! Orphan sweeps compare it with a removal's versionstamp (see `ops.rs`).
//!
//! Orphan marker, at `("couch_workers", "orphans", WorkerType, Worker)`:
//! `(RemovalVS,)`, the tuple versionstamp of the commit that removed the
//! worker while leaving some of its running jobs for the sweeper.

use foundationdb_tuple::{pack_with_versionstamp, unpack, Bytes, Element, Versionstamp as TupleVs};

use super::job::{AcceptToken, Job, JobState, JobVs};
use crate::store::StoreError;

/// The format version written by this code.
pub const RECORD_FORMAT: i64 = 1;

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

fn corrupt(what: &str) -> StoreError {
    StoreError::Invalid(format!("corrupt job record: {what}"))
}

impl Record {
    /// A new pending record.
    pub fn new_pending(priority: i64, info: Vec<u8>) -> Self {
        Record {
            state: JobState::Pending,
            worker: None,
            priority,
            attempts: 0,
            token: None,
            cancel_requested: false,
            vs: incomplete_vs(0),
            info,
            result: None,
        }
    }

    /// The value for `set_versionstamped_value`: the packed record with an
    /// incomplete versionstamp of `user_version`, plus the placeholder's
    /// 4-byte offset.
    pub fn encode(&self, user_version: u16) -> Vec<u8> {
        pack_with_versionstamp(&(
            RECORD_FORMAT,
            Bytes::from(self.state.name().as_bytes()),
            self.worker.as_deref().map(Bytes::from),
            self.priority,
            self.attempts,
            self.token.as_ref().map(|t| Bytes::from(&t[..])),
            self.cancel_requested,
            TupleVs::incomplete(user_version),
            Bytes::from(self.info.as_slice()),
            self.result.as_deref().map(Bytes::from),
        ))
    }

    /// The size the stored value will have (the encoding less the 4-byte
    /// offset that the store strips).
    pub fn stored_len(&self) -> usize {
        self.encode(0).len() - 4
    }

    pub fn decode(value: &[u8]) -> Result<Record, StoreError> {
        let elements: Vec<Element> = unpack(value).map_err(|e| corrupt(&e.to_string()))?;
        match elements.first().and_then(Element::as_i64) {
            Some(RECORD_FORMAT) => {}
            Some(other) => return Err(corrupt(&format!("unknown format {other}"))),
            None => return Err(corrupt("no format version")),
        }
        type V1<'a> = (
            i64,
            Bytes<'a>,
            Option<Bytes<'a>>,
            i64,
            u64,
            Option<Bytes<'a>>,
            bool,
            TupleVs,
            Bytes<'a>,
            Option<Bytes<'a>>,
        );
        let (_, state, worker, priority, attempts, token, cancel_requested, vs, info, result): V1 =
            unpack(value).map_err(|e| corrupt(&e.to_string()))?;
        let state = JobState::from_name(&state).ok_or_else(|| corrupt("unknown state"))?;
        let token = match token {
            None => None,
            Some(t) => Some(AcceptToken::try_from(&t[..]).map_err(|_| corrupt("token length"))?),
        };
        Ok(Record {
            state,
            worker: worker.map(Bytes::into_owned),
            priority,
            attempts,
            token,
            cancel_requested,
            vs: *vs.as_bytes(),
            info: info.into_owned(),
            result: result.map(Bytes::into_owned),
        })
    }

    /// The job this record describes.
    pub fn to_job(&self, job_type: &[u8], id: &[u8]) -> Job {
        Job {
            job_type: job_type.to_vec(),
            id: id.to_vec(),
            state: self.state,
            worker: self.worker.clone(),
            priority: self.priority,
            info: self.info.clone(),
            result: self.result.clone(),
            attempts: self.attempts,
            cancel_requested: self.cancel_requested,
            vs: self.vs,
        }
    }
}

/// The active value for `set_versionstamped_value`: `(1, AcceptVS)`.
pub(crate) fn encode_active(user_version: u16) -> Vec<u8> {
    pack_with_versionstamp(&(RECORD_FORMAT, TupleVs::incomplete(user_version)))
}

/// The accept versionstamp of an active value; `None` for a value this
/// code did not write (the sweeper then treats the job as old).
pub(crate) fn decode_active(value: &[u8]) -> Option<JobVs> {
    let (format, vs) = unpack::<(i64, TupleVs)>(value).ok()?;
    (format == RECORD_FORMAT).then(|| *vs.as_bytes())
}

/// The orphan marker value for `set_versionstamped_value`: `(RemovalVS,)`.
pub(crate) fn encode_orphan_marker() -> Vec<u8> {
    pack_with_versionstamp(&(TupleVs::incomplete(0),))
}

/// The removal versionstamp of an orphan marker.
pub(crate) fn decode_orphan_marker(value: &[u8]) -> Option<JobVs> {
    let (vs,) = unpack::<(TupleVs,)>(value).ok()?;
    Some(*vs.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the store does with a versionstamped value.
    fn commit(param: &[u8], stamp: [u8; 10]) -> Vec<u8> {
        let (bytes, off) = param.split_at(param.len() - 4);
        let off = u32::from_le_bytes(off.try_into().unwrap()) as usize;
        let mut out = bytes.to_vec();
        out[off..off + 10].copy_from_slice(&stamp);
        out
    }

    #[test]
    fn round_trip_binary_safe() {
        let rec = Record {
            state: JobState::Running,
            worker: Some(b"w\x00\xff".to_vec()),
            priority: i64::MIN,
            attempts: 3,
            token: Some([7; 16]),
            cancel_requested: true,
            vs: incomplete_vs(9),
            info: b"{\"a\":1}".to_vec(),
            result: None,
        };
        let stored = commit(&rec.encode(9), [1; 10]);
        assert_eq!(stored.len(), rec.stored_len());
        let back = Record::decode(&stored).unwrap();
        let mut expect = rec.clone();
        expect.vs = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 9];
        assert_eq!(back, expect);
    }

    #[test]
    fn unknown_format_is_refused() {
        let v = foundationdb_tuple::pack(&(2i64, Bytes::from(&b"pending"[..])));
        assert!(matches!(Record::decode(&v), Err(StoreError::Invalid(_))));
        assert!(Record::decode(b"\xff\xff").is_err());
    }

    #[test]
    fn active_and_marker_round_trip() {
        let a = commit(&encode_active(5), [2; 10]);
        assert_eq!(decode_active(&a), Some([2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 5]));
        let m = commit(&encode_orphan_marker(), [3; 10]);
        assert_eq!(decode_orphan_marker(&m), Some([3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 0, 0]));
    }
}
