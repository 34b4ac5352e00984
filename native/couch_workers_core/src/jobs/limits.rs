//! What the running limits need written beside a job's state, kept by
//! `place`/`unplace` (`place.rs`) in the transactions that move the job:
//!
//! * the running counter of each group, `("group_running", JobType,
//!   Group)`, +1 when a job of the group starts running and −1 when it
//!   stops, so that an accept under `max_running_per_group` reads one key
//!   per group (the type's own running counter is `place`'s
//!   `("counts", JobType, "running")`);
//! * the group of a pending job in its pending key's value (`""` for a
//!   job without a group, else the tuple `(Group,)`), so that an accept
//!   passes over the jobs of a full group from the queue's keys alone,
//!   without reading their records (`ops/accept/scan.rs`).

use foundationdb_tuple::{pack, unpack, Bytes};

use super::job::JobState;
use super::record::Record;
use crate::keyspace::Keyspace;
use crate::store::Tx;

/// Moves the running counter of `rec`'s group by `delta` if `rec` is
/// running and has a group: `unplace` calls it with −1 for the record as
/// stored, `place` with +1 for the record it writes.
pub(crate) fn count_running_group(tx: &Tx, ks: &Keyspace, job_type: &[u8], rec: &Record, delta: i64) {
    if rec.state != JobState::Running {
        return;
    }
    if let Some(group) = &rec.group {
        tx.atomic_add(&ks.group_running(job_type, group), delta);
    }
}

/// The value of a pending key: the job's group.
pub(crate) fn pending_value(rec: &Record) -> Vec<u8> {
    match &rec.group {
        None => Vec::new(),
        Some(group) => pack(&(Bytes::from(group.as_slice()),)),
    }
}

/// The group a pending key's value names: `Ok(None)` for none (`""`, as
/// every pending key written before groups), `Err` for a value this code
/// does not write (the accept then reads the record).
pub(crate) fn pending_group(value: &[u8]) -> Result<Option<Vec<u8>>, ()> {
    if value.is_empty() {
        return Ok(None);
    }
    unpack::<(Bytes,)>(value).map(|(g,)| Some(g.into_owned())).map_err(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::job::JobOpts;

    #[test]
    fn a_pending_value_names_the_group_or_nothing() {
        let mut rec = Record::new(b"{}".to_vec(), &JobOpts::default());
        assert_eq!(pending_value(&rec), b"");
        assert_eq!(pending_group(&pending_value(&rec)), Ok(None));
        for group in [b"".to_vec(), b"g\x00h".to_vec(), vec![0xff; 40]] {
            rec.group = Some(group.clone());
            assert_eq!(pending_group(&pending_value(&rec)), Ok(Some(group)));
        }
        assert_eq!(pending_group(b"\x15\x01"), Err(()), "not a one-element tuple of bytes");
    }
}
