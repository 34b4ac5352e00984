//! The pruner: every node runs one. It removes ended jobs whose `keep`
//! ran out, in expiry order, in bounded transactions ([`ops::prune`]).
//!
//! It sleeps until the earliest expiry it saw, but never longer than
//! [`MAX_SLEEP`] (jittered), so that a job ended meanwhile with a shorter
//! `keep` (here or on another node) is pruned within about 4 s of its
//! expiry, inside the 5 s the API promises. The cap is what an idle node
//! pays for that promise: one read of the expiry index every 3 s (it was
//! every second; issue 16). Waking on the writes that set an expiry
//! instead would need a watched key written by every job end: not done. Pruners of
//! several nodes may work at once: each removal re-reads the record in its
//! transaction, so a job is removed once, and its subscribers get
//! `removed` from their watchers as for any removal.
//!
//! Once a minute it also clears the receipts older than
//! [`receipt::KEEP_MINUTES`] (one blind range clear: no reads, no
//! conflicts; see [`receipt`]).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::ops;
use super::receipt;
use super::place::wall_ms;
use super::service::{Live, ServiceState};
use crate::log_event;
use crate::services::{jittered, sleep_or_cancel};
use crate::store::{run, StoreError};

/// Jobs removed per transaction (FoundationDB's limits: a job's keys are
/// a few hundred bytes plus its record's reads).
pub(crate) const PRUNE_BATCH: usize = 100;

/// Longest sleep between looks at the expiry index (jittered by a fifth:
/// at most 3.6 s, plus the look).
const MAX_SLEEP: Duration = Duration::from_millis(3000);

pub(crate) async fn run_pruner(shared: Arc<ServiceState>, cancel: CancellationToken, live: Live) {
    let _live = live;
    let mut failures: u32 = 0;
    let mut receipts_cleared: Option<i64> = None;
    loop {
        let now = wall_ms();
        let ks = &shared.ks;
        let minute = receipt::minute_now();
        // No receipts on a store whose commits are never unknown.
        if receipts_cleared != Some(minute) && shared.db.commits_may_be_unknown() {
            let clear = run(shared.db.as_ref(), shared.write, |tx| async move {
                receipt::clear_old(&tx, ks, minute);
                Ok(())
            });
            let cleared = tokio::select! {
                _ = cancel.cancelled() => return,
                cleared = clear => cleared,
            };
            match cleared {
                Ok(()) => receipts_cleared = Some(minute),
                Err(e) => log_event!(shared.log, Warning, "job_receipts_clear_failed", reason = %e),
            }
        }
        // A read first: most looks find nothing due and write nothing.
        let pass = async {
            let next = run(shared.db.as_ref(), shared.read, |tx| async move { ops::next_expiry(&tx, ks).await }).await?;
            match next {
                Some(at) if at <= now => {
                    run(shared.db.as_ref(), shared.write, |tx| async move { ops::prune(&tx, ks, now, PRUNE_BATCH).await })
                        .await
                }
                next => Ok(ops::Pruned { removed: Vec::new(), next }),
            }
        };
        let pass = tokio::select! {
            _ = cancel.cancelled() => return,
            pass = pass => pass,
        };
        let sleep = match pass {
            Ok(pruned) => {
                failures = 0;
                // One event per type, for the per-type metrics.
                let mut per_type: std::collections::BTreeMap<&[u8], usize> = std::collections::BTreeMap::new();
                for (job_type, _) in &pruned.removed {
                    *per_type.entry(job_type.as_slice()).or_default() += 1;
                }
                for (job_type, count) in per_type {
                    log_event!(shared.log, Info, "jobs_pruned", "type" = job_type, count = count);
                }
                match pruned.next {
                    Some(at) if at <= now => Duration::ZERO,
                    Some(at) => Duration::from_millis(at - now).min(jittered(MAX_SLEEP, 0.2)),
                    None => jittered(MAX_SLEEP, 0.2),
                }
            }
            Err(e) => {
                if matches!(e, StoreError::Closed) || cancel.is_cancelled() {
                    return;
                }
                failures += 1;
                log_event!(shared.log, Warning, "job_prune_failed", reason = %e);
                jittered(Duration::from_millis(100u64 << failures.min(6)), 0.5)
            }
        };
        if !sleep.is_zero() && !sleep_or_cancel(sleep, &cancel).await {
            return;
        }
    }
}
