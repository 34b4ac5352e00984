//! Counting the calls made inside callers' transactions (`in_tx.rs`)
//! exactly once, when the caller's transaction commits.
//!
//! The node never sees a caller's commit (erlfdb has no commit hook), so
//! the count is the store's: every counted call (a job added, resubmitted,
//! finished, canceled or removed) also adds 1, in the caller's
//! transaction, to the relaying node's counter of its type and event,
//! `("couch_workers", "tx_counts", Node, JobType, Event)`, and to the
//! node's total, `("couch_workers", "tx_counts", Node)`. Atomic adds never
//! conflict, and land iff the transaction commits: an aborted attempt, or
//! one that erlfdb retries, adds nothing.
//!
//! The node watches its total ([`watch_loop`], a supervised task). When
//! the watch fires it reads its counters at one version, and reports each
//! counter that grew since the last read by its growth, as one log event
//! `tx_calls_counted` (`type`, `event`, `count`), which the Erlang side
//! adds to the node's metrics and emits as one telemetry event. The first
//! read ([`TxCounts::baseline`], before the node answers its start) is the
//! baseline: counts committed before this node started are not this
//! run's. The last read values live in [`TxCounts`], shared by the task's
//! restarts, so a restart neither loses nor repeats a count.
//!
//! Garbage is bounded: one set of keys per node name, per type and event.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::place::read_counter;
use crate::context::Context;
use crate::keyspace::Keyspace;
use crate::log_event;
use crate::store::{run, RangeRequest, StoreError, Transaction, Watch};
use crate::tasks::sleep_or_cancel;
use crate::tasks::watch_limit::is_too_many_watches;

/// The counted outcomes of a call in a caller's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxEvent {
    Added,
    Resubmitted,
    Finished,
    Canceled,
    Removed,
}

impl TxEvent {
    /// The event's name, in its key and in the log event.
    pub fn name(self) -> &'static str {
        match self {
            TxEvent::Added => "added",
            TxEvent::Resubmitted => "resubmitted",
            TxEvent::Finished => "finished",
            TxEvent::Canceled => "canceled",
            TxEvent::Removed => "removed",
        }
    }
}

/// Counts one `event` of `job_type` for `node`, in `tx` (the caller's).
pub fn count(tx: &dyn Transaction, ks: &Keyspace, node: &[u8], job_type: &[u8], event: TxEvent) {
    tx.atomic_add(&ks.tx_count(node, job_type, event.name().as_bytes()), 1);
    tx.atomic_add(&ks.tx_counts_total(node), 1);
}

/// A counter: its job type and event.
type Counter = (Vec<u8>, Vec<u8>);

/// One node's counting: its name, and what its last read saw (`None`
/// before the baseline).
pub struct TxCounts {
    node: Vec<u8>,
    seen: Mutex<Option<HashMap<Counter, u64>>>,
}

/// A counter that grew since the last read, and by how much.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grown {
    pub job_type: Vec<u8>,
    pub event: Vec<u8>,
    pub count: u64,
}

impl TxCounts {
    pub fn new(node: &[u8]) -> Arc<TxCounts> {
        Arc::new(TxCounts { node: node.to_vec(), seen: Mutex::new(None) })
    }

    fn lock(&self) -> MutexGuard<'_, Option<HashMap<Counter, u64>>> {
        self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Reads the counters as the baseline, if none was read yet.
    pub async fn baseline(&self, ctx: &Context) -> Result<(), StoreError> {
        let (rows, _watch) = self.read(ctx, false).await?;
        self.apply(rows);
        Ok(())
    }

    /// The node's counters at one version, and (with `watch`) a watch on
    /// its total.
    async fn read(&self, ctx: &Context, watch: bool) -> Result<(Vec<(Counter, u64)>, Option<Watch>), StoreError> {
        let (ks, node) = (&ctx.ks, self.node.as_slice());
        run(ctx.db.as_ref(), ctx.read, |tx| async move {
            let (begin, end) = ks.tx_counts_range(node);
            let rows = tx.get_range(&RangeRequest::new(begin, end)).await?;
            let counters = rows
                .into_iter()
                .filter_map(|(k, v)| ks.parse_tx_count(node, &k).map(|c| (c, read_counter(Some(v)))))
                .collect();
            Ok((counters, watch.then(|| tx.watch(&ks.tx_counts_total(node)))))
        })
        .await
    }

    /// Takes a read: what grew since the last one (nothing for the first,
    /// the baseline).
    pub fn apply(&self, rows: Vec<(Counter, u64)>) -> Vec<Grown> {
        let mut seen = self.lock();
        let Some(last) = seen.as_mut() else {
            *seen = Some(rows.into_iter().collect());
            return Vec::new();
        };
        let mut grown = Vec::new();
        for (counter, value) in rows {
            let before = last.get(&counter).copied().unwrap_or(0);
            if value > before {
                let (job_type, event) = counter.clone();
                grown.push(Grown { job_type, event, count: value - before });
            }
            last.insert(counter, value);
        }
        grown
    }
}

/// The node's watcher of its total (a supervised task): reads, reports
/// what grew, waits for the total to change, until `cancel`.
pub(crate) async fn watch_loop(ctx: Arc<Context>, counts: Arc<TxCounts>, cancel: CancellationToken) {
    let mut failures: u32 = 0;
    // Consecutive watches refused at the handle's limit.
    let mut at_limit: u32 = 0;
    loop {
        let outcome = tokio::select! {
            _ = cancel.cancelled() => return,
            outcome = counts.read(&ctx, true) => outcome,
        };
        let watch = match outcome {
            Ok((rows, watch)) => {
                failures = 0;
                for g in counts.apply(rows) {
                    let (t, e, n) = (g.job_type.as_slice(), String::from_utf8_lossy(&g.event), g.count);
                    log_event!(ctx.log, Debug, "tx_calls_counted", "type" = t, event = e.as_ref(), count = n);
                }
                watch
            }
            Err(StoreError::Closed) => return,
            Err(e) => {
                failures += 1;
                log_event!(ctx.log, Warning, "tx_counts_read_failed", reason = %e);
                if !sleep_or_cancel(Duration::from_millis(50u64 << failures.min(5)), &cancel).await {
                    return;
                }
                continue;
            }
        };
        let Some(watch) = watch else { continue };
        let fired = tokio::select! {
            _ = cancel.cancelled() => return,
            fired = watch => fired,
        };
        let pause = match fired {
            Ok(()) => {
                if at_limit > 0 {
                    at_limit = 0;
                    ctx.watch_limit.cleared();
                }
                continue;
            }
            Err(StoreError::Closed) => return,
            Err(e) if is_too_many_watches(&e) => {
                at_limit += 1;
                ctx.watch_limit.reached(at_limit)
            }
            // A store hiccup (a recovery's lost watch): read again soon.
            Err(_) => Duration::from_millis(100),
        };
        if !sleep_or_cancel(pause, &cancel).await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(t: &str, e: &str) -> Counter {
        (t.as_bytes().to_vec(), e.as_bytes().to_vec())
    }

    #[test]
    fn the_first_read_is_the_baseline_then_only_growth_is_reported() {
        let counts = TxCounts::new(b"n");
        assert_eq!(counts.apply(vec![(c("a", "added"), 5)]), vec![]);
        assert_eq!(
            counts.apply(vec![(c("a", "added"), 7), (c("b", "removed"), 1)]),
            vec![
                Grown { job_type: b"a".to_vec(), event: b"added".to_vec(), count: 2 },
                Grown { job_type: b"b".to_vec(), event: b"removed".to_vec(), count: 1 }
            ]
        );
        // Unchanged: nothing; read again: nothing again.
        assert_eq!(counts.apply(vec![(c("a", "added"), 7), (c("b", "removed"), 1)]), vec![]);
        // A counter that went down (cleared by an operator) is not growth,
        // and it counts on from where it is.
        assert_eq!(counts.apply(vec![(c("a", "added"), 0)]), vec![]);
        assert_eq!(
            counts.apply(vec![(c("a", "added"), 1)]),
            vec![Grown { job_type: b"a".to_vec(), event: b"added".to_vec(), count: 1 }]
        );
    }
}
