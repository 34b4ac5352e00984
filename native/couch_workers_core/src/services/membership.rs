//! One membership watcher per (node, worker type).
//!
//! It reads the type's members and arms a store watch on the type's `vs`
//! key in the same transaction, so no change can slip in between the read
//! and the watch; when the watch fires it reads again. Only changes of the
//! member set bump `vs`, so heartbeats wake no watcher. Every delivery
//! carries a strictly greater versionstamp than the one before.
//!
//! A change costs work in proportion to the change, not to the number of
//! members: the watcher keeps the membership in memory and, when woken,
//! reads only the type's change log since its last versionstamp (and the
//! options of the workers that joined). It reads the whole member range
//! only at start, and when the log no longer covers its last versionstamp
//! (entries are kept [`crate::workers::LOG_RETENTION_VERSIONS`]; the log's
//! floor says how far back it reaches).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{sleep_or_cancel, Live};
use crate::keyspace::Keyspace;
use crate::log::{Event, Level, Logger};
use crate::store::{run, Db, StoreError, Tx, TxOptions, Versionstamp, Watch};
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

/// What the watcher knows: the membership as of `vs`.
struct Known {
    vs: Versionstamp,
    members: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// The outcome of one read.
enum Read {
    /// The whole member range (start, or the log could not be trusted).
    Full(Membership),
    /// The changes after the known versionstamp.
    Changes(workers::MembershipChanges),
}


impl MembershipWatcher {
    pub(crate) async fn run(self, live: Live) {
        let _live = live;
        let mut known: Option<Known> = None;
        let mut failures: u32 = 0;
        loop {
            let read = self.read(known.as_ref());
            let outcome = tokio::select! {
                _ = self.cancel.cancelled() => return,
                outcome = read => outcome,
            };
            let watch = match outcome {
                Ok((read, watch)) => {
                    if failures > 0 {
                        self.log.log(self.event(Level::Notice, "membership_watch_recovered"));
                        failures = 0;
                    }
                    self.apply(&mut known, read);
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

    /// One transaction: the changes since `known` (or everything), and a
    /// watch on the type's `vs` armed at the same read version.
    async fn read(&self, known: Option<&Known>) -> Result<(Read, Watch), StoreError> {
        let ks = &self.ks;
        let worker_type = &self.worker_type;
        let since = known.map(|k| k.vs);
        run(self.db.as_ref(), self.tx_options, |tx: Tx| async move {
            let read = match since {
                Some(vs) => {
                    let changes = workers::read_membership_changes(&tx, ks, worker_type, &vs).await?;
                    if changes.complete {
                        Read::Changes(changes)
                    } else {
                        Read::Full(workers::read_membership(&tx, ks, worker_type).await?)
                    }
                }
                None => Read::Full(workers::read_membership(&tx, ks, worker_type).await?),
            };
            let watch: Watch = tx.watch(&ks.membership_vs(worker_type));
            Ok((read, watch))
        })
        .await
    }

    /// Folds a read into what the watcher knows and delivers it when the
    /// versionstamp moved (the first read is always delivered, also when
    /// empty).
    fn apply(&self, known: &mut Option<Known>, read: Read) {
        let first = known.is_none();
        let before = known.as_ref().map(|k| k.vs);
        match read {
            Read::Full(membership) => {
                // Never step back: a full read is at or after what was
                // delivered.
                let vs = before.map_or(membership.vs, |b| b.max(membership.vs));
                *known = Some(Known { vs, members: membership.workers.into_iter().collect() });
            }
            Read::Changes(changes) => {
                if let Some(k) = known.as_mut() {
                    for (worker, options) in changes.changes {
                        match options {
                            Some(options) => k.members.insert(worker, options),
                            None => k.members.remove(&worker),
                        };
                    }
                    k.vs = k.vs.max(changes.vs);
                }
            }
        }
        let Some(k) = known.as_ref() else { return };
        if first || before.is_some_and(|b| k.vs > b) {
            (self.on_update)(Membership {
                worker_type: self.worker_type.clone(),
                vs: k.vs,
                workers: k.members.iter().map(|(w, o)| (w.clone(), o.clone())).collect(),
            });
        }
    }

    fn event(&self, level: Level, what: &'static str) -> Event {
        Event::new(level, what).with("type", &self.worker_type)
    }
}
