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
//! A finish that queues the job again (a resubmission made while it ran)
//! commits without the accept: the requeue writes the record and the
//! pending key with versionstamps, which the same transaction cannot read
//! back (FoundationDB's `accessed_unreadable`), so the next job is taken
//! in a transaction of its own, as `job_accept` with timeout 0 would.

use std::sync::Arc;

use super::commit::complete_handle_vs;
use super::job::{Fence, JobHandle, JobState};
use super::ops::{self, Take};
use super::place::wall_ms;
use super::receipt::{self, Receipt};
use super::service::ServiceState;
use crate::error::Error;
use crate::keyspace::Incarnation;
use crate::store::{run_attempts, StoreError};

/// The worker an accept is for: its type, its id and, if given, the
/// registration that must still hold the id.
#[derive(Debug, Clone, Copy)]
pub struct NextFor<'a> {
    pub worker_type: &'a [u8],
    pub worker: &'a [u8],
    pub incarnation: Option<Incarnation>,
}

impl ServiceState {
    /// Finishes the job `fence` holds and, in the same transaction, takes
    /// the next pending job for `next`. `Ok(None)`: the finish committed
    /// and no job was taken (none pending, the type paused, or the
    /// registration no longer holds the id). An error of the finish
    /// (`NotOwner`, `NotFound`, ...) wrote nothing and took nothing.
    pub(crate) async fn finish_accept(
        self: &Arc<Self>,
        fence: &Fence,
        result: &[u8],
        next: NextFor<'_>,
    ) -> Result<Option<JobHandle>, Error> {
        let ks = &self.ks;
        let db = self.db.as_ref();
        let receipt = db.commits_may_be_unknown().then(|| Receipt::new(ks));
        let receipt = receipt.as_ref();
        let workers = [next.worker.to_vec()];
        let incarnations = [next.incarnation];
        // Drawn outside the retry loop: every attempt takes under the same
        // token, so a retry can find what an earlier one took.
        let tokens = ops::new_tokens(1);
        let (w, i, t) = (&workers[..], &incarnations[..], &tokens[..]);
        let mut attempts = 0u32;
        let claimed = self.dispatchers.claims.holder(next.worker_type);
        let claims = Some(&claimed);
        let outcome = run_attempts(db, self.write, |tx, attempt| {
            attempts += 1;
            // The last attempt's claims: its commit is over.
            claimed.begin_attempt();
            let (recheck, retries) = (attempts > 1, attempts - 1);
            async move {
                let landed = match receipt.filter(|_| attempt.may_have_committed) {
                    Some(r) => r.landed(&tx).await?.is_some(),
                    None => false,
                };
                if !landed {
                    let job = match ops::finish(&tx, ks, fence, result).await? {
                        Ok(job) => job,
                        Err(e) => return Ok(Err(e)),
                    };
                    if let Some(r) = receipt {
                        r.write(&tx, receipt::DONE);
                    }
                    // A resubmission made while the job ran queued it
                    // again: its record and pending key are now written
                    // with versionstamps, which this transaction may not
                    // read back (`accessed_unreadable`), and the accept
                    // round would read both (the pending range, the
                    // record). The finish commits alone; the accept
                    // follows it in its own transaction.
                    if matches!(job.state, JobState::Pending | JobState::Scheduled) {
                        return Ok(Ok(None));
                    }
                }
                let acceptors = ops::Acceptors { workers: w, incarnations: i, tokens: t, recheck, retries, claims };
                Ok(Ok(Some(ops::accept(&tx, ks, next.worker_type, acceptors).await?)))
            }
        })
        .await;
        drop(claimed);
        let (round, info) = match outcome {
            Ok((Ok(Some(round)), info)) => (round, info),
            Ok((Ok(None), _)) => {
                // The finish committed (requeued by its resubmission) and
                // took nothing: take the next job as `job_accept` with
                // timeout 0 would. An attempt whose commit was unknown took
                // nothing either (it accepted nothing), so the token is
                // free.
                return Ok(self.accept_now(next.worker_type, next.worker, next.incarnation).await.ok());
            }
            Ok((Err(e), _)) => return Err(e),
            Err(e) => {
                // An attempt may have taken a job that nobody will hold.
                if !matches!(e, StoreError::Closed) {
                    self.reclaim(next.worker_type.to_vec(), vec![(next.worker.to_vec(), tokens[0])]);
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
            // the finish has committed; take one as `job_accept` with
            // timeout 0 would.
            Some(Take::NoJob) if due || round.more => {
                match self.accept_now(next.worker_type, next.worker, next.incarnation).await {
                    Ok(handle) => Ok(Some(handle)),
                    // The finish committed: it is never answered as an error
                    // (a job the accept may have taken it gives back itself).
                    Err(_) => Ok(None),
                }
            }
            _ => Ok(None),
        }
    }
}
