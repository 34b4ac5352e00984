//! The node's schedule runner: sleeps until the earliest due slot of any
//! schedule (one read of the first `schedule_due` keys, with a watch on
//! `schedules_vs` armed at the same read version, so that a schedule set
//! meanwhile with an earlier slot wakes it), then fires the due ones,
//! each in its own transaction (`ops::fire`). Every node runs one; the
//! slots' transactions make sure each slot is fired once. An idle node
//! wakes only at slots, at a change of the schedules, and at most every
//! [`MAX_SLEEP`].

use std::sync::Arc;
use std::time::Duration;

use rand::seq::SliceRandom as _;
use tokio_util::sync::CancellationToken;

use super::ops::{self, DueKey};
use crate::context::Context;
use crate::jobs::place::wall_ms;
use crate::log_event;
use crate::store::{run, StoreError, Watch};
use crate::tasks::sleep_or_cancel;

/// The longest sleep without a look (a watch that could not fire, a
/// clock that jumped).
pub const MAX_SLEEP: Duration = Duration::from_secs(60);

/// Due keys read per look.
const BATCH: usize = 32;

#[derive(Clone)]
pub(crate) struct ScheduleRunner {
    pub ctx: Arc<Context>,
    pub cancel: CancellationToken,
}

impl ScheduleRunner {
    /// The runner's loop; supervised.
    pub(crate) async fn run(self) {
        let mut failures: u32 = 0;
        loop {
            let look = tokio::select! {
                _ = self.cancel.cancelled() => return,
                look = self.look() => look,
            };
            let (due, watch) = match look {
                Ok(look) => {
                    failures = 0;
                    look
                }
                Err(e) => {
                    failures += 1;
                    log_event!(self.ctx.log, Warning, "schedule_read_failed", reason = %e);
                    if !sleep_or_cancel(Duration::from_millis(50u64 << failures.min(5)), &self.cancel).await {
                        return;
                    }
                    continue;
                }
            };
            let now = wall_ms();
            let mut ready: Vec<DueKey> = due.iter().filter(|(at, _, _)| *at <= now).cloned().collect();
            if !ready.is_empty() {
                // Nodes that look at once fire in different orders, so
                // that they conflict less.
                ready.shuffle(&mut rand::rng());
                for (at, job_type, id) in ready {
                    if self.cancel.is_cancelled() {
                        return;
                    }
                    self.fire(at, &job_type, &id).await;
                }
                continue;
            }
            let wait = due.first().map_or(MAX_SLEEP, |(at, _, _)| Duration::from_millis(at - now).min(MAX_SLEEP));
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
                fired = watch => if let Err(e) = fired {
                    if self.cancel.is_cancelled() {
                        return;
                    }
                    // A store hiccup or the watch limit: look again after
                    // a pause rather than spin.
                    log_event!(self.ctx.log, Debug, "schedule_watch_failed", reason = %e);
                    if !sleep_or_cancel(Duration::from_millis(200), &self.cancel).await {
                        return;
                    }
                },
            }
        }
    }

    /// One transaction: the first due keys, and a watch on
    /// `schedules_vs` armed at the same read version.
    async fn look(&self) -> Result<(Vec<DueKey>, Watch), StoreError> {
        let ks = &self.ctx.ks;
        run(self.ctx.db.as_ref(), self.ctx.read, |tx| async move {
            let due = ops::first_due(&tx, ks, BATCH).await?;
            let watch: Watch = tx.watch(&ks.schedules_vs());
            Ok((due, watch))
        })
        .await
    }

    /// Fires one schedule's due slot; a failure is logged (the next look
    /// finds the slot still due).
    async fn fire(&self, at: u64, job_type: &[u8], id: &[u8]) {
        let ks = &self.ctx.ks;
        let now = wall_ms();
        let fired =
            run(self.ctx.db.as_ref(), self.ctx.write, |tx| async move { ops::fire(&tx, ks, job_type, id, at, now).await })
                .await;
        match fired {
            Ok(f) if !f.stale => {
                let created = f.created.len();
                let skipped = f.skipped;
                log_event!(self.ctx.log, Debug, "schedule_fired", "type" = job_type, id = id, created = created, skipped = skipped);
            }
            Ok(_) => {}
            Err(e) => {
                log_event!(self.ctx.log, Warning, "schedule_fire_failed", "type" = job_type, id = id, reason = %e);
                let _ = sleep_or_cancel(Duration::from_millis(100), &self.cancel).await;
            }
        }
    }
}
