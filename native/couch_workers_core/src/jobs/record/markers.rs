//! The small values beside the job record: the active value (the accept's
//! versionstamp) and the orphan marker (a removed worker's removals).
//! Formats: `docs/keyspace.md` ("Active value", "Orphan marker").

use foundationdb_tuple::{pack_with_versionstamp, unpack, Bytes, Versionstamp as TupleVs};

use super::VALUE_FORMAT;
use crate::jobs::job::JobVs;

/// The active value for `set_versionstamped_value`: `(1, AcceptVS)`.
pub(crate) fn encode_active(user_version: u16) -> Vec<u8> {
    pack_with_versionstamp(&(VALUE_FORMAT, TupleVs::incomplete(user_version)))
}

/// The accept versionstamp of an active value; `None` for a value this
/// code did not write (the sweeper then treats the job as old).
pub(crate) fn decode_active(value: &[u8]) -> Option<JobVs> {
    let (format, vs) = unpack::<(i64, TupleVs)>(value).ok()?;
    (format == VALUE_FORMAT).then(|| *vs.as_bytes())
}

/// One removal an orphan marker records: its versionstamp, and whether it
/// was a death (its jobs fail) rather than an unregister (released).
pub(crate) type Removal = (JobVs, bool);

/// Bytes of one earlier removal in a marker: its versionstamp and a flag.
const REMOVAL_LEN: usize = 13;

fn departure_tag(lost: bool) -> &'static [u8] {
    if lost {
        b"lost"
    } else {
        b"released"
    }
}

/// The orphan marker value for `set_versionstamped_value`: `(RemovalVS,)`
/// for a worker that was unregistered (its jobs are released), or
/// `(RemovalVS, "lost")` for one that died (its jobs fail). When earlier
/// removals of the same worker id still have jobs waiting for the sweeper
/// (`earlier`, oldest first), they are kept, each with its own rule:
/// `(RemovalVS, "lost" | "released", Earlier)`, `Earlier` being 13 bytes
/// per removal (its 12-byte versionstamp, then 1 for a death, 0 for an
/// unregister).
pub(crate) fn encode_orphan_marker(lost: bool, earlier: &[Removal]) -> Vec<u8> {
    if !earlier.is_empty() {
        let mut packed = Vec::with_capacity(earlier.len() * REMOVAL_LEN);
        for (vs, lost) in earlier {
            packed.extend_from_slice(vs);
            packed.push(u8::from(*lost));
        }
        let why = Bytes::from(departure_tag(lost));
        return pack_with_versionstamp(&(TupleVs::incomplete(0), why, Bytes::from(packed)));
    }
    if lost {
        pack_with_versionstamp(&(TupleVs::incomplete(0), Bytes::from(&b"lost"[..])))
    } else {
        pack_with_versionstamp(&(TupleVs::incomplete(0),))
    }
}

/// The latest removal of an orphan marker: its versionstamp, and whether
/// the worker died.
pub(crate) fn decode_orphan_marker(value: &[u8]) -> Option<Removal> {
    decode_orphan_removals(value).and_then(|r| r.last().copied())
}

/// Every removal an orphan marker records, oldest first (the last is the
/// latest). A job accepted before a removal and after the one before it
/// ran under the registration that removal ended, and follows its rule.
pub(crate) fn decode_orphan_removals(value: &[u8]) -> Option<Vec<Removal>> {
    if let Ok((vs,)) = unpack::<(TupleVs,)>(value) {
        return Some(vec![(*vs.as_bytes(), false)]);
    }
    if let Ok((vs, why)) = unpack::<(TupleVs, Bytes)>(value) {
        return (&*why == b"lost").then(|| vec![(*vs.as_bytes(), true)]);
    }
    let (vs, why, earlier) = unpack::<(TupleVs, Bytes, Bytes)>(value).ok()?;
    let lost = match &*why {
        b"lost" => true,
        b"released" => false,
        _ => return None,
    };
    if earlier.len() % REMOVAL_LEN != 0 {
        return None;
    }
    let mut removals = Vec::with_capacity(earlier.len() / REMOVAL_LEN + 1);
    for r in earlier.chunks_exact(REMOVAL_LEN) {
        let vs: JobVs = r[..12].try_into().ok()?;
        removals.push((vs, r[12] != 0));
    }
    removals.push((*vs.as_bytes(), lost));
    Some(removals)
}
