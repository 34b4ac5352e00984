//! The promoter: every node runs one. It moves the scheduled jobs that
//! fell due to pending in the store ([`ops::promote_due`], bounded
//! batches), for every job type, also where no acceptor waits: a
//! dispatcher does it on its own timer for the types it serves, this task
//! for all the others, so that a due job is stored as `pending` (its
//! state's counter and index) within about a second of its `run_at`.
//! Until then the reads count and list it as pending (`ops::counts`,
//! `ops::list`), reading the few due keys not yet promoted.
//!
//! Each pass reads the type list and, per type, the earliest scheduled
//! key (one key each), and sleeps until the earliest `run_at` it saw, but
//! never longer than [`MAX_SLEEP`] (jittered), so that a job added
//! meanwhile with an earlier `run_at` waits about a second at most.
//! Promoters of several nodes may work at once: each move re-reads the
//! record in its transaction, so a job is moved once.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::ops;
use super::place::wall_ms;
use super::service::{Live, ServiceState};
use crate::log_event;
use crate::services::{jittered, sleep_or_cancel};
use crate::store::{run, StoreError};

/// Longest sleep between passes.
const MAX_SLEEP: Duration = Duration::from_millis(1000);

pub(crate) async fn run_promoter(shared: Arc<ServiceState>, cancel: CancellationToken, live: Live) {
    let _live = live;
    let mut failures: u32 = 0;
    loop {
        let pass = tokio::select! {
            _ = cancel.cancelled() => return,
            pass = pass(&shared) => pass,
        };
        let sleep = match pass {
            Ok(next) => {
                failures = 0;
                let cap = jittered(MAX_SLEEP, 0.2);
                next.map_or(cap, |at| Duration::from_millis(at.saturating_sub(wall_ms())).min(cap))
            }
            Err(e) => {
                if matches!(e, StoreError::Closed) || cancel.is_cancelled() {
                    return;
                }
                failures += 1;
                log_event!(shared.log, Warning, "job_promote_failed", reason = %e);
                jittered(Duration::from_millis(100u64 << failures.min(6)), 0.5)
            }
        };
        if !sleep.is_zero() && !sleep_or_cancel(sleep, &cancel).await {
            return;
        }
    }
}

/// One pass: promotes what is due; returns the earliest `run_at` left.
async fn pass(shared: &ServiceState) -> Result<Option<u64>, StoreError> {
    let ks = &shared.ks;
    // A read first: most passes find nothing due and write nothing.
    let earliest = run(shared.db.as_ref(), shared.read, |tx| async move {
        let mut out = Vec::new();
        for job_type in ops::job_types(&tx, ks).await? {
            if let Some(at) = ops::next_run_at(&tx, ks, &job_type).await? {
                out.push((job_type, at));
            }
        }
        Ok(out)
    })
    .await?;
    let now = wall_ms();
    let mut next: Option<u64> = None;
    for (job_type, at) in earliest {
        let left = if at <= now { shared.promote(&job_type).await? } else { Some(at) };
        next = match (next, left) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    Ok(next)
}
