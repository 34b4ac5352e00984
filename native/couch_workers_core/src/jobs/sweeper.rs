//! The orphan sweeper: every node runs one. It finishes the failover of
//! workers that were removed while running more jobs than one transaction
//! may requeue (see `ops::requeue_worker_jobs`).
//!
//! It lists the orphan markers and arms a watch on `orphans_vs` in the
//! same transaction, works off each marker in bounded transactions
//! (`ops::sweep_orphan`), then sleeps until the watch fires (a removal
//! left a new marker) or a jittered period passes (a safety net for a
//! lost watch). Sweepers of several nodes may work on the same marker:
//! each batch re-reads what it changes, so a job is requeued once.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::ops::{self, SweepCursor, SweepStep};
use crate::context::Context;
use crate::log_event;
use crate::store::{run, StoreError};
use crate::tasks::watch_limit::is_too_many_watches;
use crate::tasks::{jittered, sleep_or_cancel};

/// Markers listed per pass.
const LIST_LIMIT: usize = 100;

/// Longest sleep between passes when no watch fires.
const PERIOD: Duration = Duration::from_secs(10);

/// The sweeper's loop; supervised (`tasks/supervise.rs`), its live
/// count held by the supervisor from the moment it is spawned (a `stats()`
/// right after start sees it).
pub(crate) async fn run_sweeper(shared: std::sync::Arc<Context>, cancel: CancellationToken) {
    let mut failures: u32 = 0;
    // Consecutive watches refused at the handle's limit.
    let mut at_limit: u32 = 0;
    loop {
        let ks = &shared.ks;
        let listed = run(shared.db.as_ref(), shared.read, |tx| async move { ops::orphans(&tx, ks, LIST_LIMIT).await });
        let listed = tokio::select! {
            _ = cancel.cancelled() => return,
            listed = listed => listed,
        };
        let (markers, watch) = match listed {
            Ok(found) => found,
            Err(e) => {
                if matches!(e, StoreError::Closed) || cancel.is_cancelled() {
                    return;
                }
                failures += 1;
                log_event!(shared.log, Warning, "job_sweep_failed", reason = %e);
                if !sleep_or_cancel(jittered(Duration::from_millis(100u64 << failures.min(6)), 0.5), &cancel).await {
                    return;
                }
                continue;
            }
        };
        let full = markers.len() == LIST_LIMIT;
        let mut ok = true;
        for (worker_type, worker) in markers {
            match sweep_one(&shared, &cancel, &worker_type, &worker).await {
                Ok(moved) => {
                    if moved > 0 {
                        let (t, w) = (worker_type.as_slice(), worker.as_slice());
                        log_event!(shared.log, Notice, "orphaned_jobs_requeued", "type" = t, worker = w, count = moved);
                    }
                }
                Err(e) => {
                    if matches!(e, StoreError::Closed) || cancel.is_cancelled() {
                        return;
                    }
                    ok = false;
                    let (t, w) = (worker_type.as_slice(), worker.as_slice());
                    log_event!(shared.log, Warning, "job_sweep_failed", "type" = t, worker = w, reason = %e);
                }
            }
        }
        if ok {
            failures = 0;
        } else {
            failures += 1;
        }
        if full && ok {
            continue;
        }
        let wait =
            if ok { jittered(PERIOD, 0.2) } else { jittered(Duration::from_millis(100u64 << failures.min(6)), 0.5) };
        let fired = tokio::select! {
            _ = cancel.cancelled() => return,
            fired = watch => Some(fired),
            _ = tokio::time::sleep(wait) => None,
        };
        match fired {
            Some(Ok(())) if at_limit > 0 => {
                at_limit = 0;
                shared.watch_limit.cleared();
            }
            Some(Err(e)) if is_too_many_watches(&e) => {
                // No watch at the handle's limit (it fails at once): the
                // pass period is the poll, not a tight loop of listings.
                at_limit += 1;
                let _ = shared.watch_limit.reached(at_limit);
                if !sleep_or_cancel(wait, &cancel).await {
                    return;
                }
            }
            _ => {}
        }
    }
}

/// Works one marker off; returns how many jobs moved.
async fn sweep_one(
    shared: &Context,
    cancel: &CancellationToken,
    worker_type: &[u8],
    worker: &[u8],
) -> Result<usize, StoreError> {
    let mut cursor: Option<SweepCursor> = None;
    let mut moved = 0;
    loop {
        if cancel.is_cancelled() {
            return Err(StoreError::Closed);
        }
        let ks = &shared.ks;
        let c = cursor.as_ref();
        let step = run(shared.db.as_ref(), shared.write, |tx| async move {
            ops::sweep_orphan(&tx, ks, worker_type, worker, c).await
        })
        .await?;
        match step {
            SweepStep::Done { moved: n } => return Ok(moved + n),
            SweepStep::More { moved: n, cursor: next } => {
                moved += n;
                cursor = Some(next);
            }
        }
    }
}
