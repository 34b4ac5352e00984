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
//! key (one key each), arms a watch on `scheduled_vs` in the same read
//! transaction, and sleeps until the earliest `run_at` it saw or until
//! that key changes: every transaction that schedules a job before every
//! scheduled job of its type bumps it (`place::Queued::wake`), a new
//! type's first one included, so a job scheduled meanwhile is never later
//! than what the promoter waits for. An idle node's promoter thus reads
//! nothing until a schedule changes, except once every [`MAX_SLEEP`] (a
//! safety net: a watch may be lost with the store's connection); without
//! a working watch it looks every second, as before watches.
//! Promoters of several nodes may work at once: each move re-reads the
//! record in its transaction, so a job is moved once.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::ops;
use super::place::wall_ms;
use super::wake::{WatchedSleep, Woke};
use crate::context::Context;
use crate::log_event;
use crate::store::{run, StoreError, Watch};
use crate::tasks::{jittered, sleep_or_cancel};

/// Longest sleep between passes while the watch is armed.
const MAX_SLEEP: Duration = Duration::from_secs(30);

/// The promoter's loop; supervised (`tasks/supervise.rs`).
pub(crate) async fn run_promoter(shared: Arc<Context>, cancel: CancellationToken) {
    let mut failures: u32 = 0;
    let mut watched = WatchedSleep::new(&shared.watch_limit);
    loop {
        let pass = tokio::select! {
            _ = cancel.cancelled() => return,
            pass = pass(&shared) => pass,
        };
        match pass {
            Ok((next, watch)) => {
                failures = 0;
                let cap = jittered(MAX_SLEEP, 0.2);
                let sleep = next.map_or(cap, |at| Duration::from_millis(at.saturating_sub(wall_ms())).min(cap));
                if sleep.is_zero() {
                    continue;
                }
                if watched.sleep(sleep, Some(watch), &cancel).await == Woke::Cancelled {
                    return;
                }
            }
            Err(e) => {
                if matches!(e, StoreError::Closed) || cancel.is_cancelled() {
                    return;
                }
                failures += 1;
                log_event!(shared.log, Warning, "job_promote_failed", reason = %e);
                if !sleep_or_cancel(jittered(Duration::from_millis(100u64 << failures.min(6)), 0.5), &cancel).await {
                    return;
                }
            }
        }
    }
}

/// One pass: promotes what is due; returns the earliest `run_at` left and
/// a watch on `scheduled_vs` armed at the pass's first read.
async fn pass(shared: &Context) -> Result<(Option<u64>, Watch), StoreError> {
    let ks = &shared.ks;
    // A read first: most passes find nothing due and write nothing. The
    // watch is armed at the same read version as the reads: a schedule
    // committed after them fires it.
    let (earliest, watch) = run(shared.db.as_ref(), shared.read, |tx| async move {
        let watch = tx.watch(&ks.scheduled_vs());
        let mut out = Vec::new();
        for job_type in ops::job_types(&tx, ks).await? {
            if let Some(at) = ops::next_run_at(&tx, ks, &job_type).await? {
                out.push((job_type, at));
            }
        }
        Ok((out, watch))
    })
    .await?;
    let now = wall_ms();
    let mut next: Option<u64> = None;
    for (job_type, at) in earliest {
        let left = if at <= now { promote(shared, &job_type).await? } else { Some(at) };
        next = match (next, left) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    Ok((next, watch))
}

/// Most scheduled jobs one transaction moves to pending.
const PROMOTE_BATCH: usize = 500;

/// Moves the type's due scheduled jobs to pending (bounded batches), by
/// this node's wall clock. Returns the earliest `run_at` left.
pub(crate) async fn promote(ctx: &Context, job_type: &[u8]) -> Result<Option<u64>, StoreError> {
    let ks = &ctx.ks;
    loop {
        let now = wall_ms();
        let (moved, next) = run(ctx.db.as_ref(), ctx.write, |tx| async move {
            ops::promote_due(&tx, ks, job_type, now, PROMOTE_BATCH).await
        })
        .await?;
        if moved < PROMOTE_BATCH || next.is_some_and(|t| t > now) {
            return Ok(next);
        }
    }
}
