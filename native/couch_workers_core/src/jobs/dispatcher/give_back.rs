//! Jobs a take took but could not hand out: given back to pending after a
//! round that may have committed failed ([`reclaim`]) or after a delivery
//! failed ([`release`]), retried with backoff in a task of their own until
//! they land; and jobs a round failed because no worker can hold them,
//! logged ([`log_unrunnable`]). Apart from the dispatcher's loop because
//! the node's other takes (`take.rs`, `finish_next.rs`) and the service
//! use them too.

use std::sync::Arc;
use std::time::Duration;

use crate::context::Context;
use crate::jobs::job::{AcceptToken, Fence, JobHandle};
use crate::jobs::ops;
use crate::log_event;
use crate::store::{run, StoreError};
use crate::tasks::{jittered, sleep_or_cancel};

/// An accept round failed after an attempt that may have committed:
/// gives back, in a task of its own, the jobs it may have taken under
/// `taken`'s tokens (nobody holds those handles), retrying with
/// backoff until it succeeds or the node stops ([`ops::reclaim`]).
/// Its own task: the caller answers at once, and the store that made
/// the round fail may need a while to recover.
pub(crate) fn reclaim(ctx: &Arc<Context>, job_type: Vec<u8>, taken: Vec<(Vec<u8>, AcceptToken)>) {
    if taken.is_empty() || ctx.cancel.is_cancelled() {
        return;
    }
    let shared = ctx.clone();
    ctx.spawn(async move {
        let ks = &shared.ks;
        let (t, j) = (&taken, &job_type);
        for failures in 0u32.. {
            let given =
                run(shared.db.as_ref(), shared.write, |tx| async move { ops::reclaim(&tx, ks, j, t).await }).await;
            match given {
                Ok(n) => {
                    if n > 0 {
                        log_event!(shared.log, Info, "job_accept_reclaimed", "type" = j.as_slice(), count = n);
                    }
                    return;
                }
                Err(e) => {
                    log_event!(shared.log, Warning, "job_accept_reclaim_failed", "type" = j.as_slice(), reason = %e);
                    if matches!(e, StoreError::Closed)
                        || !sleep_or_cancel(
                            jittered(Duration::from_millis(50u64 << failures.min(6)), 0.5),
                            &shared.cancel,
                        )
                        .await
                    {
                        return;
                    }
                }
            }
        }
    });
}

/// Gives back a job whose delivery failed (see `dispatcher`'s module
/// comment).
/// The first try runs here; if the store fails it (a stall longer
/// than the call's budget, say), the give-back is retried with
/// backoff in a task of its own until it lands: left undone, the job
/// would stay running for a live worker that never heard of it, and
/// no failover would ever end it. Each failure is logged; a give-back
/// the node's stop cuts short is logged as abandoned (the job then
/// stays with its worker until the worker leaves).
pub(crate) async fn release(ctx: &Arc<Context>, handle: JobHandle) {
    let fence = handle.fence();
    if give_back_once(ctx, &fence, 1).await {
        return;
    }
    let shared = ctx.clone();
    ctx.spawn(async move {
        for failures in 1u32.. {
            let pause = jittered(Duration::from_millis(50u64 << failures.min(6)), 0.5);
            if !sleep_or_cancel(pause, &shared.cancel).await {
                let (t, id, worker) = (fence.job_type.as_slice(), fence.job_id.as_slice(), fence.worker.as_slice());
                log_event!(
                    shared.log,
                    Error,
                    "job_release_abandoned",
                    "type" = t,
                    id = id,
                    worker = worker,
                    reason = "node_stopped",
                    failures = failures
                );
                return;
            }
            if give_back_once(&shared, &fence, failures + 1).await {
                return;
            }
        }
    });
}

/// One transaction of [`release`]: true once the give-back is
/// settled (done, or nothing left to give back: the accept no longer
/// holds the job, or the store is closed), false if it must be tried
/// again.
async fn give_back_once(ctx: &Context, fence: &Fence, attempt: u32) -> bool {
    let ks = &ctx.ks;
    let released = run(ctx.db.as_ref(), ctx.write, |tx| async move { ops::give_back(&tx, ks, fence).await }).await;
    let (t, id, worker) = (fence.job_type.as_slice(), fence.job_id.as_slice(), fence.worker.as_slice());
    match released {
        Ok(true) => {
            log_event!(ctx.log, Info, "job_released", "type" = t, id = id, worker = worker);
            true
        }
        Ok(false) => true,
        Err(e) => {
            let closed = matches!(e, StoreError::Closed);
            log_event!(
                ctx.log,
                Warning,
                "job_release_failed",
                "type" = t,
                id = id,
                worker = worker,
                reason = %e,
                failures = attempt,
                retry = !closed
            );
            closed
        }
    }
}

/// Logs each job an accept round failed because no worker can hold it
/// (`ops::accept`): the one word of it besides its error.
pub(crate) fn log_unrunnable(ctx: &Context, job_type: &[u8], ids: &[Vec<u8>]) {
    for id in ids {
        log_event!(
            ctx.log,
            Error,
            "job_failed_unrunnable",
            "type" = job_type,
            id = id.as_slice(),
            reason = "value_too_large"
        );
    }
}
