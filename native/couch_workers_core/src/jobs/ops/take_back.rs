//! The take-back of a running job whose record did not change for its
//! activity timeout: as by its worker's death (an attempt spent, pending
//! again or failed), with the error `activity_timeout`, in the
//! observer's transaction (`services/activity/`).

use super::helpers::read_record;
use super::run_end::{end_run, RunEnd};
use crate::jobs::job::JobState;
use crate::jobs::place::{self, earliest_scheduled};
use crate::jobs::record::Record;
use crate::keyspace::Keyspace;
use crate::store::{StoreError, Tx};

/// One index key an observer found due: `(job type, timeout s, the
/// record's versionstamp it was written with, job id)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub job_type: Vec<u8>,
    pub timeout_s: i64,
    pub vs: [u8; 12],
    pub id: Vec<u8>,
}

/// What a take-back found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeBack {
    /// The job was taken from `worker`; its state is now `state`.
    Taken { worker: Vec<u8>, state: JobState },
    /// The record changed since the key was written (or is gone): nothing
    /// to take; the key, left behind by nothing this code writes, is
    /// cleared if it is still there.
    Changed,
}

/// Takes the job of `due` back from its worker if its record is still the
/// one the key was written with: running, with the key's versionstamp.
/// The record is read for a write (not a snapshot), so an update that
/// commits first makes this transaction conflict and look again, and of
/// two observers only one takes it.
pub async fn take_back(tx: &Tx, ks: &Keyspace, due: &Due) -> Result<TakeBack, StoreError> {
    let (job_type, id) = (&due.job_type[..], &due.id[..]);
    let rec = match read_record(tx, ks, job_type, id, false).await {
        Ok(rec) => rec,
        // A record no reader can decode says nothing of a run.
        Err(StoreError::Invalid(_)) => None,
        Err(e) => return Err(e),
    };
    let Some(mut rec) = rec.filter(|r| still_running(r, due)) else {
        tx.clear(&ks.activity(job_type, due.timeout_s, &due.vs, id));
        return Ok(TakeBack::Changed);
    };
    let worker = rec.worker.clone().unwrap_or_default();
    let now = place::wall_ms();
    // Only a resubmission waiting for the run's end can schedule the job.
    let before = if rec.resubmit.is_some() { earliest_scheduled(tx, ks, job_type).await? } else { None };
    let queued = end_run(tx, ks, job_type, id, &mut rec, RunEnd::TimedOut, 0, now);
    queued.wake(tx, ks, job_type, before);
    Ok(TakeBack::Taken { worker, state: rec.state })
}

fn still_running(rec: &Record, due: &Due) -> bool {
    rec.state == JobState::Running && rec.vs == due.vs && rec.worker.is_some()
}

/// Clears the key of `due` if the record no longer is the one it was
/// written with (a key left behind: see `jobs/activity.rs`); leaves it,
/// and the job, alone otherwise. Returns whether it cleared it.
pub async fn clear_if_stale(tx: &Tx, ks: &Keyspace, due: &Due) -> Result<bool, StoreError> {
    let rec = match read_record(tx, ks, &due.job_type, &due.id, false).await {
        Ok(rec) => rec,
        Err(StoreError::Invalid(_)) => None,
        Err(e) => return Err(e),
    };
    if rec.is_some_and(|r| still_running(&r, due)) {
        return Ok(false);
    }
    tx.clear(&ks.activity(&due.job_type, due.timeout_s, &due.vs, &due.id));
    Ok(true)
}
