//! Activity timeouts: the index of running jobs by their record's last
//! change, kept by `place.rs`.
//!
//! A running job with a finite activity timeout (its option
//! `activity_timeout`, else its type's setting of the same name) has one
//! index key, `("activity", JobType, TimeoutS, VS, JobId) = Worker`,
//! written in the transaction that writes its record, with the record's
//! versionstamp (same commit, same user version): every change of the
//! record while it runs (an update, a cancel request, a resubmission
//! waiting for the run's end) moves it, and the run's end clears it. So
//! within one `(JobType, TimeoutS)` the keys are in the order of the
//! jobs' last changes, and an observer reads only the keys older than
//! its cutoff (`services/activity/`), never the whole index. A job or
//! type with no timeout writes no key and reads nothing more.
//!
//! Which timeout a run has is fixed when its record is written: its own
//! option if it has one; else its type's setting, as this node last read
//! it (`Keyspace::type_timeouts`, kept by the node's activity observer:
//! the writer reads nothing more). So a type's setting applies to the
//! runs accepted or changed after the writing node has read it; a run
//! keeps the timeout of its last write until its next. A key written
//! under an earlier value may be left behind when the record changes
//! (its clear names the value the writer knows now): it names the
//! record's old `vs`, and the observer clears it when it is due.

use super::job::{ActivityTimeout, JobState};
use super::record::Record;
use crate::keyspace::Keyspace;
use crate::store::Tx;

/// The activity timeout of `rec`'s run (a job of `job_type`), in
/// seconds: `None` when it has none (not running, or an infinite
/// timeout).
pub(crate) fn run_timeout(ks: &Keyspace, job_type: &[u8], rec: &Record) -> Option<i64> {
    if rec.state != JobState::Running {
        return None;
    }
    match rec.activity_timeout {
        Some(ActivityTimeout::Seconds(s)) => i64::try_from(s).ok(),
        Some(ActivityTimeout::Infinity) => None,
        None => ks.type_timeouts().get(job_type),
    }
}

/// Writes the index key of `rec` (running, about to be written with
/// `user_version`), if its run has a timeout.
pub(crate) fn index(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8], rec: &Record, user_version: u16) {
    if let (Some(timeout), Some(worker)) = (run_timeout(ks, job_type, rec), rec.worker.as_deref()) {
        tx.set_versionstamped_key(&ks.activity_new(job_type, timeout, user_version, id), worker);
    }
}

/// [`index`] at the start of a run (an accept): it also bumps
/// `activity_vs`, which wakes the observers that found the index empty
/// (a change of a running job finds them awake: its run is indexed).
pub(crate) fn index_run(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8], rec: &Record, user_version: u16) {
    if run_timeout(ks, job_type, rec).is_some() {
        index(tx, ks, job_type, id, rec, user_version);
        tx.set_versionstamped_value(&ks.activity_vs(), &Keyspace::vs_placeholder_value());
    }
}

/// Clears the index key of `rec` as stored (its `vs`), if it has one.
pub(crate) fn unindex(tx: &Tx, ks: &Keyspace, job_type: &[u8], id: &[u8], rec: &Record) {
    if let Some(timeout) = run_timeout(ks, job_type, rec) {
        tx.clear(&ks.activity(job_type, timeout, &rec.vs, id));
    }
}
