//! One accept for one worker, now: the accept with timeout 0
//! (`job_accept/3` with no wait), which the node's job service and a
//! finish's next accept (`finish_next.rs`) run. No dispatcher: one
//! transaction a round, a few rounds at most.

use std::sync::Arc;

use super::commit::complete_handle_vs;
use super::dispatcher::{log_unrunnable, reclaim};
use super::job::JobHandle;
use super::ops::{self, Take};
use super::place::wall_ms;
use super::promoter::promote;
use crate::context::Context;
use crate::error::Error;
use crate::keyspace::Incarnation;
use crate::store::{run_attempts, StoreError};

/// Most rounds an accept with timeout 0 runs when a round cleared stale
/// pending keys instead of finding a job.
const ACCEPT_NOW_ROUNDS: usize = 8;

/// One accept transaction for one worker (for `incarnation` only, if
/// given), no waiting.
pub(crate) async fn accept_now(
    ctx: &Arc<Context>,
    worker_type: &[u8],
    worker: &[u8],
    incarnation: Option<Incarnation>,
    claims: &ops::Claims,
) -> Result<JobHandle, Error> {
    let workers = vec![worker.to_vec()];
    let incarnations = [incarnation];
    let ks = &ctx.ks;
    for _ in 0..ACCEPT_NOW_ROUNDS {
        let tokens = ops::new_tokens(1);
        let mut attempts = 0u32;
        let claimed = claims.holder(worker_type);
        let claimed = &claimed;
        let outcome = run_attempts(ctx.db.as_ref(), ctx.write, |tx, _| {
            attempts += 1;
            let acceptors = ops::Acceptors::attempt(&workers, &incarnations, &tokens, attempts, claimed);
            async move { ops::accept(&tx, ks, worker_type, acceptors).await }
        })
        .await;
        let (round, info) = match outcome {
            Ok(done) => done,
            Err(e) => {
                // The call answers the error; a job an attempt may
                // have taken goes back to pending (nobody holds it).
                if !matches!(e, StoreError::Closed) {
                    reclaim(ctx, worker_type.to_vec(), vec![(worker.to_vec(), tokens[0])]);
                }
                return Err(e.into());
            }
        };
        log_unrunnable(ctx, worker_type, &round.unrunnable);
        let more = round.more;
        let due = round.next_due.is_some_and(|t| t <= wall_ms()) && !round.paused;
        match round.takes.into_iter().next() {
            Some(Take::Job(mut handle)) => {
                complete_handle_vs(&mut handle, &info)?;
                return Ok(handle);
            }
            Some(Take::NoJob) if due => {
                promote(ctx, worker_type).await?;
                continue;
            }
            Some(Take::NoJob) if more => continue,
            _ => return Err(Error::NotFound),
        }
    }
    Err(Error::NotFound)
}
