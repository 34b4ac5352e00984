//! The pruner: every node runs one. It removes ended jobs whose `keep`
//! ran out, in expiry order, in bounded transactions ([`ops::prune`]).
//!
//! It sleeps until the earliest expiry it saw, or until `expiry_vs`
//! changes (a watch armed in the look's read transaction), but never
//! longer than [`MAX_SLEEP`] (jittered). Every job end whose `keep` is
//! shorter than [`WAKE_KEEP_S`] bumps `expiry_vs` (`place::place`); a
//! longer one falls due after the pruner's next look anyway (that look is
//! at most 36 s after the end's commit, and its expiry 60 s or more after
//! the end's start), so it is pruned within 5 s of its expiry, as the API
//! promises, without waking anyone. So an idle node's pruner reads the
//! expiry index once every 30 s or so, and a node whose jobs keep
//! forever (the default) never has it woken. After a change it looks no
//! sooner than [`MIN_GAP`] after its previous look: a burst of short-kept
//! job ends costs one look a second, not one per end. Pruners of
//! several nodes may work at once: each removal re-reads the record in its
//! transaction, so a job is removed once, and its subscribers get
//! `removed` from their watchers as for any removal.
//!
//! Once a minute it also clears the receipts older than
//! [`receipt::KEEP_MINUTES`] (one blind range clear: no reads, no
//! conflicts; see [`receipt`]), and the running counters of up to
//! [`GROUPS_SWEPT`] groups that run nothing ([`ops::clear_idle_groups`]),
//! going on from where the last minute's sweep stopped: a group that ran
//! once leaves no key behind for long.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::ops;
use super::place::{wall_ms, WAKE_KEEP_S};
use super::wake::{WatchedSleep, Woke};
use crate::context::Context;
use crate::log_event;
use crate::store::{receipt, run, StoreError};
use crate::tasks::{jittered, sleep_or_cancel};

/// Jobs removed per transaction (FoundationDB's limits: a job's keys are
/// a few hundred bytes plus its record's reads).
pub(crate) const PRUNE_BATCH: usize = 100;

/// Groups' running counters looked at per minute (one transaction).
const GROUPS_SWEPT: usize = 500;

/// Longest sleep between looks at the expiry index (jittered by a fifth:
/// at most 36 s, plus the look): half of [`WAKE_KEEP_S`], so that a job
/// end that does not wake the pruners (its commit up to 19 s after its
/// start, the look after it at most 36 s later) is due after that look.
const MAX_SLEEP: Duration = Duration::from_secs(WAKE_KEEP_S / 2);

/// Shortest time from one look to the next one that a change triggers.
const MIN_GAP: Duration = Duration::from_millis(1000);

/// The pruner's loop; supervised (`tasks/supervise.rs`).
pub(crate) async fn run_pruner(shared: Arc<Context>, cancel: CancellationToken) {
    let mut failures: u32 = 0;
    let mut receipts_cleared: Option<i64> = None;
    let mut groups_swept: Option<i64> = None;
    let mut groups_from: Option<Vec<u8>> = None;
    let mut watched = WatchedSleep::new(&shared.watch_limit);
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
        if groups_swept != Some(minute) {
            let after = groups_from.as_deref();
            // A read first: a write transaction only when a counter is at
            // 0 (an idle node takes no write lock for it).
            let sweep = async {
                let (idle, next) = run(shared.db.as_ref(), shared.read, |tx| async move {
                    ops::idle_groups_ahead(&tx, ks, after, GROUPS_SWEPT).await
                })
                .await?;
                if !idle {
                    return Ok(ops::GroupsSwept { cleared: 0, next });
                }
                run(shared.db.as_ref(), shared.write, |tx| async move {
                    ops::clear_idle_groups(&tx, ks, after, GROUPS_SWEPT).await
                })
                .await
            };
            let swept = tokio::select! {
                _ = cancel.cancelled() => return,
                swept = sweep => swept,
            };
            match swept {
                Ok(swept) => {
                    groups_swept = Some(minute);
                    groups_from = swept.next;
                    if swept.cleared > 0 {
                        log_event!(shared.log, Debug, "group_counters_cleared", count = swept.cleared);
                    }
                }
                Err(e) => log_event!(shared.log, Warning, "group_counters_clear_failed", reason = %e),
            }
        }
        // A read first: most looks find nothing due and write nothing.
        // The watch is armed at the read's version: an expiry written
        // after the read fires it.
        let began = tokio::time::Instant::now();
        let pass = async {
            let (next, watch) = run(shared.db.as_ref(), shared.read, |tx| async move {
                let watch = tx.watch(&ks.expiry_vs());
                Ok((ops::next_expiry(&tx, ks).await?, watch))
            })
            .await?;
            let pruned =
                match next {
                    Some(at) if at <= now => {
                        run(shared.db.as_ref(), shared.write, |tx| async move {
                            ops::prune(&tx, ks, now, PRUNE_BATCH).await
                        })
                        .await?
                    }
                    next => ops::Pruned { removed: Vec::new(), next },
                };
            Ok::<_, StoreError>((pruned, watch))
        };
        let pass = tokio::select! {
            _ = cancel.cancelled() => return,
            pass = pass => pass,
        };
        match pass {
            Ok((pruned, watch)) => {
                failures = 0;
                // One event per type, for the per-type metrics.
                let mut per_type: std::collections::BTreeMap<&[u8], usize> = std::collections::BTreeMap::new();
                for (job_type, _) in &pruned.removed {
                    *per_type.entry(job_type.as_slice()).or_default() += 1;
                }
                for (job_type, count) in per_type {
                    log_event!(shared.log, Info, "jobs_pruned", "type" = job_type, count = count);
                }
                let cap = jittered(MAX_SLEEP, 0.2);
                let sleep = match pruned.next {
                    Some(at) if at <= now => continue,
                    Some(at) => Duration::from_millis(at - now).min(cap),
                    None => cap,
                };
                match watched.sleep(sleep, Some(watch), &cancel).await {
                    Woke::Cancelled => return,
                    Woke::Timer => {}
                    Woke::Changed => {
                        let soonest = began + jittered(MIN_GAP, 0.2);
                        let wait = soonest.saturating_duration_since(tokio::time::Instant::now());
                        if !wait.is_zero() && !sleep_or_cancel(wait, &cancel).await {
                            return;
                        }
                    }
                }
            }
            Err(e) => {
                if matches!(e, StoreError::Closed) || cancel.is_cancelled() {
                    return;
                }
                failures += 1;
                log_event!(shared.log, Warning, "job_prune_failed", reason = %e);
                if !sleep_or_cancel(jittered(Duration::from_millis(100u64 << failures.min(6)), 0.5), &cancel).await {
                    return;
                }
            }
        }
    }
}
