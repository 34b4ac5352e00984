//! A worker's finish and its next accept in one transaction
//! (`job_finish_accept/3`): the job queue's version of a worker loop that
//! moves a job to finished and fetches the next one in one step, so that
//! a busy worker pays one transaction and one call per job instead of two.
//!
//! The finish is exactly `ops::finish`; the accept is exactly the accept
//! round of one waiter (`ops::accept`), with its token drawn once for every
//! attempt, so that a retry after an unknown commit finds the job that
//! attempt took (`Acceptors::recheck`) and the finish answers for its own
//! landed write (its receipt), as `job_finish/2` does.
//!
//! Many workers of one queue calling it at once each take in a
//! transaction of their own. Those of one node pass over the jobs the
//! others are taking (`ops::Claims`), and a take that lost a job to
//! another node's retries a little down the queue (`ops::accept`'s
//! `spread`): before, every retry read the head again, which the others
//! kept taking, and on FoundationDB one call could lose every race until
//! its budget ended and answer `timeout` (`tests/jobs_take_contention.rs`).
//!
//! Many workers of one queue calling it at once each take in a
//! transaction of their own. Those of one node pass over the jobs the
//! others are taking (`ops::Claims`), and a take that lost a job to
//! another node's retries a little down the queue (`ops::accept`'s
//! `spread`): before, every retry read the head again, which the others
//! kept taking, and on FoundationDB one call could lose every race until
//! its budget ended and answer `timeout` (`tests/jobs_take_contention.rs`).
//!
//! A finish that queues the job again (a resubmission made while it ran)
//! commits without the accept: the requeue writes the record and the
//! pending key with versionstamps, which the same transaction cannot read
//! back (FoundationDB's `accessed_unreadable`), so the next job is taken
//! in a transaction of its own.
//!
//! That follow-up (also when the first transaction's round took nothing
//! but jobs may be left: stale pending keys cleared, scheduled jobs due)
//! is one accept round, never more: the caller waits for the finish's
//! answer twice the API's call timeout (two transaction budgets and their
//! commit graces fit in it, not more), and a committed finish must not
//! reach it as a timeout. A job this round leaves is the worker's next
//! accept's (tests/jobs_finish_accept_slow.rs).

use std::sync::Arc;

use super::commit::complete_handle_vs;
use super::dispatcher::{log_unrunnable, reclaim};
use super::job::{Fence, JobHandle, JobState};
use super::ops::{self, Take};
use super::place::wall_ms;
use crate::context::Context;
use crate::error::Error;
use crate::keyspace::Incarnation;
use crate::store::receipt::{self, RetrySafe};
use crate::store::{run_attempts, StoreError};

/// The worker an accept is for: its type, its id and, if given, the
/// registration that must still hold the id.
#[derive(Debug, Clone, Copy)]
pub struct NextFor<'a> {
    pub worker_type: &'a [u8],
    pub worker: &'a [u8],
    pub incarnation: Option<Incarnation>,
}

/// Finishes the job `fence` holds and, in the same transaction, takes
/// the next pending job for `next`. `Ok(None)`: the finish committed
/// and no job was taken (none pending, the type paused, or the
/// registration no longer holds the id). An error of the finish
/// (`NotOwner`, `NotFound`, ...) wrote nothing and took nothing.
pub(crate) async fn finish_accept(
    ctx: &Arc<Context>,
    fence: &Fence,
    result: &[u8],
    next: NextFor<'_>,
    claims: &ops::Claims,
) -> Result<Option<JobHandle>, Error> {
    let ks = &ctx.ks;
    let db = ctx.db.as_ref();
    let safe = RetrySafe::new(db, ks);
    let safe = &safe;
    let workers = [next.worker.to_vec()];
    let incarnations = [next.incarnation];
    // Drawn outside the retry loop: every attempt takes under the same
    // token, so a retry can find what an earlier one took.
    let tokens = ops::new_tokens(1);
    let (w, i, tk) = (&workers[..], &incarnations[..], &tokens[..]);
    let mut attempts = 0u32;
    let claimed = claims.holder(next.worker_type);
    let claimed = &claimed;
    let outcome = run_attempts(db, ctx.write, |tx, attempt| {
        attempts += 1;
        let acceptors = ops::Acceptors::attempt(w, i, tk, attempts, claimed);
        // The finish sets the receipt; an attempt after its landed
        // write only accepts.
        let t = tx.clone();
        async move {
            safe.attempt(&t, attempt, move |landed| async move {
                let mut finished = None;
                if landed.is_none() {
                    let job = match ops::finish(&tx, ks, fence, result).await? {
                        Ok(job) => job,
                        Err(e) => return Ok((Err(e), None)),
                    };
                    finished = Some(receipt::DONE.to_vec());
                    // A resubmission made while the job ran queued it
                    // again: its record and pending key are now written
                    // with versionstamps, which this transaction may not
                    // read back (`accessed_unreadable`), and the accept
                    // round would read both (the pending range, the
                    // record). The finish commits alone; the accept
                    // follows it in its own transaction.
                    if matches!(job.state, JobState::Pending | JobState::Scheduled) {
                        return Ok((Ok(None), finished));
                    }
                }
                Ok((Ok(Some(ops::accept(&tx, ks, next.worker_type, acceptors).await?)), finished))
            })
            .await
        }
    })
    .await;
    let (round, info) = match outcome {
        Ok((Ok(Some(round)), info)) => (round, info),
        Ok((Ok(None), _)) => {
            // The finish committed (requeued by its resubmission) and
            // took nothing: take the next job in one round of its own.
            // An attempt whose commit was unknown took nothing either
            // (it accepted nothing), so the token is free.
            return Ok(follow_up(ctx, next, claims).await);
        }
        Ok((Err(e), _)) => return Err(e),
        Err(e) => {
            // An attempt may have taken a job that nobody will hold.
            if !matches!(e, StoreError::Closed) {
                reclaim(ctx, next.worker_type.to_vec(), vec![(next.worker.to_vec(), tokens[0])]);
            }
            return Err(e.into());
        }
    };
    let due = round.next_due.is_some_and(|t| t <= wall_ms()) && !round.paused;
    match round.takes.into_iter().next() {
        Some(Take::Job(mut handle)) => {
            complete_handle_vs(&mut handle, &info)?;
            Ok(Some(handle))
        }
        // Jobs may be left that this round could not take (due
        // scheduled ones, a spent byte budget, stale keys cleared):
        // the finish has committed; one more round may take one.
        Some(Take::NoJob) if due || round.more => Ok(follow_up(ctx, next, claims).await),
        _ => Ok(None),
    }
}

/// The one accept round after a finish that committed without taking
/// a job (see the module doc): one transaction run, no promotion, no
/// further round. The finish committed, so nothing here is an error:
/// `None` when no job was taken, and a job this round may have taken
/// for nobody goes back to pending.
async fn follow_up(ctx: &Arc<Context>, next: NextFor<'_>, claims: &ops::Claims) -> Option<JobHandle> {
    let ks = &ctx.ks;
    let workers = [next.worker.to_vec()];
    let incarnations = [next.incarnation];
    let tokens = ops::new_tokens(1);
    let (w, i, t) = (&workers[..], &incarnations[..], &tokens[..]);
    let mut attempts = 0u32;
    let claimed = claims.holder(next.worker_type);
    let claimed = &claimed;
    let outcome = run_attempts(ctx.db.as_ref(), ctx.write, |tx, _| {
        attempts += 1;
        let acceptors = ops::Acceptors::attempt(w, i, t, attempts, claimed);
        async move { ops::accept(&tx, ks, next.worker_type, acceptors).await }
    })
    .await;
    let taken = match outcome {
        Ok((round, info)) => {
            log_unrunnable(ctx, next.worker_type, &round.unrunnable);
            match round.takes.into_iter().next() {
                Some(Take::Job(mut handle)) => complete_handle_vs(&mut handle, &info).map(|()| handle).ok(),
                _ => return None,
            }
        }
        Err(StoreError::Closed) => return None,
        Err(_) => None,
    };
    if taken.is_none() {
        reclaim(ctx, next.worker_type.to_vec(), vec![(next.worker.to_vec(), tokens[0])]);
    }
    taken
}
