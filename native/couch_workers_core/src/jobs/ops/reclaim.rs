//! Jobs taken by an accept whose handles nobody got go back to pending:
//! one delivery that failed, or a whole round whose outcome is unknown.

use super::accept::RECHECK_MAX_JOBS;
use super::helpers::{get_some, read_record};
use super::run_end::{end_run, RunEnd};
use crate::jobs::job::{AcceptToken, Fence, JobOpts, JobState};
use crate::jobs::place::{self, Queued};
use crate::jobs::record::Record;
use crate::keyspace::Keyspace;
use crate::store::{RangeRequest, StoreError, Tx};

/// Gives back every job that an accept round whose outcome is unknown (its
/// call failed after a commit that may have landed) took: running for one
/// of `taken`'s workers under that waiter's token. Nobody got those
/// handles, so each goes back to pending as [`give_back`] does. Reads at
/// most [`RECHECK_MAX_JOBS`] running jobs per worker. Returns how many it
/// gave back.
pub async fn reclaim(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    taken: &[(Vec<u8>, AcceptToken)],
) -> Result<usize, StoreError> {
    let mut workers: Vec<&[u8]> = taken.iter().map(|(w, _)| w.as_slice()).collect();
    workers.sort();
    workers.dedup();
    let now = place::wall_ms();
    let mut given = 0usize;
    let mut user_version: u16 = 0;
    let mut queued = Queued::default();
    for worker in workers {
        fence_late_accept(tx, ks, worker_type, worker).await?;
        let (begin, end) = ks.active_range(worker_type, worker);
        let rows = tx.get_range(&RangeRequest::new(begin, end).limit(RECHECK_MAX_JOBS)).await?;
        let ids: Vec<Option<Vec<u8>>> =
            rows.iter().map(|(k, _)| ks.parse_active_job_id(worker_type, worker, k)).collect();
        let values = get_some(tx, ids.iter().map(|id| id.as_ref().map(|id| ks.job(worker_type, id))), false).await?;
        for (id, value) in ids.iter().zip(values) {
            let (Some(id), Some(value)) = (id, value) else { continue };
            let Ok(mut rec) = Record::decode(&value) else { continue };
            let ours = rec.state == JobState::Running
                && rec.worker.as_deref() == Some(worker)
                && rec.token.is_some_and(|t| taken.iter().any(|(w, tok)| w.as_slice() == worker && *tok == t));
            if !ours {
                continue;
            }
            let end = RunEnd::Released { opts: JobOpts::default(), info: None, bump: false };
            queued.merge(end_run(tx, ks, worker_type, id, &mut rec, end, user_version, now));
            user_version = user_version.wrapping_add(1);
            given += 1;
        }
    }
    queued.wake(tx, ks, worker_type, None);
    Ok(given)
}

/// Makes sure that no attempt of the unknown round lands after this
/// transaction without it seeing that attempt's jobs.
///
/// An attempt cut off in its commit by the call's time budget may still
/// be in flight, and land later (FoundationDB, and the sim store, apply a
/// commit whose caller went away). Reading the worker's active range is
/// not enough: a reclaim that finds nothing writes nothing, commits
/// read-only (no conflict check), and the late commit then leaves its jobs
/// running under tokens nobody holds, for a live worker that is never
/// reaped. Every accept round reads each of its workers' member keys
/// without snapshot, so writing the member key back (same value, or the
/// same absence) fences it: a round attempt that commits after this one
/// conflicts, and one that committed after this one's read version makes
/// this one conflict (it wrote active keys in the range read here), and
/// the retry finds its jobs.
async fn fence_late_accept(tx: &Tx, ks: &Keyspace, worker_type: &[u8], worker: &[u8]) -> Result<(), StoreError> {
    let member = ks.member(worker_type, worker);
    match tx.get(&member, false).await? {
        Some(value) => tx.set(&member, &value),
        None => tx.clear(&member),
    }
    Ok(())
}

/// Undoes a delivery that failed (the acceptor went away after the
/// transaction that took the job): the job goes back to pending exactly as
/// on failover, if the accept of `fence` still holds it. Returns whether it
/// did.
pub async fn give_back(tx: &Tx, ks: &Keyspace, fence: &Fence) -> Result<bool, StoreError> {
    let Some(mut rec) = read_record(tx, ks, &fence.job_type, &fence.job_id, false).await? else {
        return Ok(false);
    };
    if rec.state != JobState::Running || rec.token != Some(fence.token) {
        return Ok(false);
    }
    // Attempts count accepts: this one happened. The worker never saw
    // the job, so no attempt limit is raised either.
    let end = RunEnd::Released { opts: JobOpts::default(), info: None, bump: false };
    let queued = end_run(tx, ks, &fence.job_type, &fence.job_id, &mut rec, end, 0, place::wall_ms());
    queued.wake(tx, ks, &fence.job_type, None);
    Ok(true)
}
