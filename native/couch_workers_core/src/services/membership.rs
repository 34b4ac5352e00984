//! One membership watcher per (node, worker type).
//!
//! It reads the type's members and arms a store watch on the type's `vs`
//! key in the same transaction, so no change can slip in between the read
//! and the watch; when the watch fires it reads again. Only changes of the
//! member set bump `vs`, so heartbeats wake no watcher. Every delivery
//! carries a strictly greater versionstamp than the one before.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{sleep_or_cancel, LiveGuard};
use crate::keyspace::Keyspace;
use crate::log::{Event, Level, Logger};
use crate::store::{run, Db, TxOptions, Watch};
use crate::workers::{self, Membership};

/// Called with every new membership; must not block (the NIF sends a
/// message).
pub type OnMembership = Box<dyn Fn(Membership) + Send + Sync>;

pub(crate) struct MembershipWatcher {
    pub db: Db,
    pub ks: Keyspace,
    pub worker_type: Vec<u8>,
    pub on_update: OnMembership,
    pub log: Logger,
    pub cancel: CancellationToken,
    pub tx_options: TxOptions,
}

impl MembershipWatcher {
    /// `live` was taken by the spawner, so that the task counts from the
    /// moment it is spawned, not from its first poll.
    pub(crate) async fn run(self, live: LiveGuard) {
        let _live = live;
        let mut last_sent: Option<[u8; 10]> = None;
        let mut failures: u32 = 0;
        loop {
            let ks = &self.ks;
            let worker_type = &self.worker_type;
            let read = run(self.db.as_ref(), self.tx_options, |tx| async move {
                let membership = workers::read_membership(&tx, ks, worker_type).await?;
                let watch: Watch = tx.watch(&ks.membership_vs(worker_type));
                Ok((membership, watch))
            });
            let outcome = tokio::select! {
                _ = self.cancel.cancelled() => return,
                outcome = read => outcome,
            };
            let watch = match outcome {
                Ok((membership, watch)) => {
                    if failures > 0 {
                        self.log.log(self.event(Level::Notice, "membership_watch_recovered"));
                        failures = 0;
                    }
                    // The first read is always delivered, also when empty.
                    if last_sent.is_none_or(|vs| membership.vs > vs) {
                        last_sent = Some(membership.vs);
                        (self.on_update)(membership);
                    }
                    watch
                }
                Err(e) => {
                    failures += 1;
                    self.log.log(self.event(Level::Warning, "membership_read_failed").with("reason", e.to_string()));
                    let backoff = Duration::from_millis(50u64 << failures.min(5));
                    if !sleep_or_cancel(backoff, &self.cancel).await {
                        return;
                    }
                    continue;
                }
            };
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                fired = watch => {
                    if let Err(e) = fired {
                        if self.cancel.is_cancelled() {
                            return;
                        }
                        // A failed watch (store hiccup, too many watches):
                        // read again after a pause rather than spin.
                        self.log.log(self.event(Level::Warning, "membership_watch_failed").with("reason", e.to_string()));
                        if !sleep_or_cancel(Duration::from_millis(100), &self.cancel).await {
                            return;
                        }
                    }
                }
            }
        }
    }

    fn event(&self, level: Level, what: &'static str) -> Event {
        Event::new(level, what).with("type", &self.worker_type)
    }
}
