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
use crate::store::receipt::{self, RetriedWrite};
use crate::store::StoreError;
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
        // Retry-safe (`store::receipt`): a retry after a commit that
        // landed but was answered `commit_unknown_result` finds nothing
        // left to give back, and must still tell what that commit did.
        let mut write = RetriedWrite::new(shared.db.as_ref(), ks);
        for failures in 0u32.. {
            let given = write
                .run(shared.db.as_ref(), shared.write, |tx, landed| async move {
                    if let Some(outcome) = landed {
                        return Ok((receipt::parse_count(&outcome), None));
                    }
                    let n = ops::reclaim(&tx, ks, j, t).await?;
                    Ok((n, Some(receipt::count_outcome(n))))
                })
                .await;
            match given {
                Ok((n, _)) => {
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
    // One receipt for every try (`store::receipt`): a try after a commit
    // that landed but was answered `commit_unknown_result` finds the job
    // no longer this accept's by its own doing, and still logs the
    // release.
    let mut write = RetriedWrite::new(ctx.db.as_ref(), &ctx.ks);
    if give_back_once(ctx, &fence, &mut write, 1).await {
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
            if give_back_once(&shared, &fence, &mut write, failures + 1).await {
                return;
            }
        }
    });
}

/// One try of [`release`]: true once the give-back is settled (done, or
/// nothing left to give back: the accept no longer holds the job, or the
/// store is closed), false if it must be tried again.
async fn give_back_once(ctx: &Context, fence: &Fence, write: &mut RetriedWrite, attempt: u32) -> bool {
    let ks = &ctx.ks;
    let released = write
        .run(ctx.db.as_ref(), ctx.write, |tx, landed| async move {
            if landed.is_some() {
                return Ok((true, None));
            }
            let given = ops::give_back(&tx, ks, fence).await?;
            Ok((given, given.then(|| receipt::DONE.to_vec())))
        })
        .await;
    let (t, id, worker) = (fence.job_type.as_slice(), fence.job_id.as_slice(), fence.worker.as_slice());
    match released {
        Ok((true, _)) => {
            log_event!(ctx.log, Info, "job_released", "type" = t, id = id, worker = worker);
            true
        }
        Ok((false, _)) => {
            // Failed over, canceled or removed meanwhile: the job is no
            // longer this accept's, and whoever took it answers for it.
            log_event!(ctx.log, Info, "job_release_skipped", "type" = t, id = id, worker = worker, reason = "not_held");
            true
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::job::{JobOpts, JobSpec, JobState};
    use crate::jobs::take::accept_now;
    use crate::log::{Collect, Logger, Value};
    use crate::roster;
    use crate::workers::WorkerSpec;
    use crate::store::sim::{CommitFault, SimOptions, SimStore};
    use crate::store::{run, TxOptions};

    /// The `count` of every `job_accept_reclaimed` event so far.
    fn reclaimed(log: &Collect) -> Vec<i64> {
        let count = |e: &crate::log::Event| {
            e.fields.iter().find_map(|(k, v)| match v {
                Value::Int(n) if *k == "count" => Some(*n),
                _ => None,
            })
        };
        log.named("job_accept_reclaimed").iter().map(|e| count(e).unwrap_or(-1)).collect()
    }

    /// A reclaim whose commit lands but is answered
    /// `commit_unknown_result`: its retry finds nothing left to give back
    /// (its own doing), and still logs the one job it gave back. On a
    /// bare context (no node, no service): the scripted fault is the next
    /// commit's, the reclaim's.
    #[tokio::test]
    async fn a_landed_unknown_reclaim_logs_what_it_gave_back() {
        let sim = SimStore::new(SimOptions::new(22));
        let log = Arc::new(Collect::default());
        let ctx = Context::new(sim.clone(), Logger::new(log.clone()), TxOptions::write());
        let ks = &ctx.ks;
        let job = JobSpec { id: b"j".to_vec(), info: b"{}".to_vec(), opts: JobOpts::default() };
        let j = &job;
        run(sim.as_ref(), ctx.write, |tx| async move { ops::add_job(&tx, ks, b"t", j, 0).await })
            .await
            .expect("add")
            .expect("added");
        let spec = WorkerSpec { worker_type: b"t".to_vec(), id: b"w".to_vec(), options_json: b"{}".to_vec(), timeout_s: 3600 };
        let s = &spec;
        run(sim.as_ref(), ctx.write, |tx| async move { roster::register(&tx, ks, s, &[7; 16], 0).await })
            .await
            .expect("register");
        let handle = accept_now(&ctx, b"t", b"w", None, &ops::Claims::default()).await.expect("accept");
        let before = sim.stats().unknown_committed;
        sim.inject_commit_fault(CommitFault::UnknownCommitted);
        reclaim(&ctx, b"t".to_vec(), vec![(b"w".to_vec(), handle.token)]);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while reclaimed(&log).is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(sim.stats().unknown_committed, before + 1, "the reclaim's commit landed unknown");
        assert_eq!(reclaimed(&log), vec![1], "logged once, with the job it gave back");
        let rec = run(sim.as_ref(), ctx.read, |tx| async move { ops::get(&tx, ks, b"t", b"j").await })
            .await
            .expect("get")
            .expect("found");
        assert_eq!(rec.state, JobState::Pending, "given back");
        ctx.close();
    }
}
