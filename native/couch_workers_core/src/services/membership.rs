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
//!
//! Each delivery ([`MembershipUpdate`]) lends the whole membership and,
//! when the watcher knows it, what changed since the delivery before, so
//! that a receiver that keeps its own copy (the NIF) can pass on only the
//! change. [`OnMembership`] receivers get an owned copy of the whole
//! membership instead (tests, examples): a copy per delivery.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::log_event;
use crate::store::{run, StoreError, Tx, Versionstamp, Watch};
use crate::tasks::sleep_or_cancel;
use crate::tasks::watch_limit::is_too_many_watches;
use crate::workers::{self, Membership};

/// Called with every new membership, as an owned copy; must not block.
pub type OnMembership = Box<dyn Fn(Membership) + Send + Sync>;

/// Called with every delivery of a watcher; must not block (the NIF
/// sends a message).
pub type OnMembershipUpdate = Box<dyn Fn(MembershipUpdate<'_>) + Send + Sync>;

/// A worker that is now a member, with its options JSON, or (`None`) one
/// that left.
pub type MemberChange = (Vec<u8>, Option<Vec<u8>>);

/// One delivery: the membership as of `vs`, lent for the call.
pub struct MembershipUpdate<'a> {
    pub worker_type: &'a [u8],
    pub vs: Versionstamp,
    /// Every member and its options JSON.
    pub members: &'a BTreeMap<Vec<u8>, Vec<u8>>,
    /// What turns the previous delivery's members into `members`, at most
    /// one entry per worker (a join of a member is new options). `None` on
    /// the first delivery and whenever the watcher read the whole member
    /// range (or changed its members without a delivery): then only
    /// `members` tells.
    pub changes: Option<&'a [MemberChange]>,
}

impl MembershipUpdate<'_> {
    /// An owned copy of the whole membership.
    pub fn to_membership(&self) -> Membership {
        Membership {
            worker_type: self.worker_type.to_vec(),
            vs: self.vs,
            workers: self.members.iter().map(|(w, o)| (w.clone(), o.clone())).collect(),
        }
    }
}

#[derive(Clone)]
pub(crate) struct MembershipWatcher {
    pub ctx: Arc<Context>,
    pub worker_type: Vec<u8>,
    pub on_update: Arc<OnMembershipUpdate>,
    /// What the watcher delivered, kept over restarts (`supervise.rs`), so
    /// that a restarted watcher goes on from it: no delivery repeats one
    /// before it.
    pub known: Arc<Mutex<Option<Known>>>,
    pub cancel: CancellationToken,
}

/// What the watcher knows: the membership as of `vs`.
pub(crate) struct Known {
    vs: Versionstamp,
    members: BTreeMap<Vec<u8>, Vec<u8>>,
    /// `members` changed since the last delivery other than by the changes
    /// of the next one: that delivery carries no `changes`.
    resync: bool,
}

/// The outcome of one read.
enum Read {
    /// The whole member range (start, or the log could not be trusted).
    Full(Membership),
    /// The changes after the known versionstamp.
    Changes(workers::MembershipChanges),
}

impl MembershipWatcher {
    /// The watcher's loop; supervised (`supervise.rs`).
    pub(crate) async fn run(self) {
        if let Some(k) = self.known().as_mut() {
            // A restart: what the last run folded in is not known to have
            // been delivered, so the next delivery is whole.
            k.resync = true;
        }
        let mut failures: u32 = 0;
        // Consecutive watches refused at the handle's limit.
        let mut at_limit: u32 = 0;
        loop {
            let since = self.known().as_ref().map(|k| k.vs);
            let read = self.read(since);
            let outcome = tokio::select! {
                _ = self.cancel.cancelled() => return,
                outcome = read => outcome,
            };
            let watch = match outcome {
                Ok((read, watch)) => {
                    if failures > 0 {
                        log_event!(
                            self.ctx.log,
                            Notice,
                            "membership_watch_recovered",
                            "type" = self.worker_type.as_slice()
                        );
                        failures = 0;
                    }
                    self.apply(read);
                    watch
                }
                Err(e) => {
                    failures += 1;
                    log_event!(self.ctx.log, Warning, "membership_read_failed", "type" = self.worker_type.as_slice(), reason = %e);
                    let backoff = Duration::from_millis(50u64 << failures.min(5));
                    if !sleep_or_cancel(backoff, &self.cancel).await {
                        return;
                    }
                    continue;
                }
            };
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                fired = watch => match fired {
                    Ok(()) => {
                        crate::stage::mark("membership_woken");
                        if at_limit > 0 {
                            at_limit = 0;
                            self.ctx.watch_limit.cleared();
                        }
                    }
                    Err(_) if self.cancel.is_cancelled() => return,
                    Err(e) if is_too_many_watches(&e) => {
                        // The handle's limit: back off, growing, and let
                        // the node log the episode once (watch_limit.rs).
                        at_limit += 1;
                        let pause = self.ctx.watch_limit.reached(at_limit);
                        let delay_ms = pause.as_millis() as u64;
                        log_event!(self.ctx.log, Debug, "membership_watch_deferred", "type" = self.worker_type.as_slice(), delay_ms = delay_ms);
                        if !sleep_or_cancel(pause, &self.cancel).await {
                            return;
                        }
                    }
                    Err(e) => {
                        // A store hiccup: read again after a pause rather
                        // than spin.
                        log_event!(self.ctx.log, Warning, "membership_watch_failed", "type" = self.worker_type.as_slice(), reason = %e);
                        if !sleep_or_cancel(Duration::from_millis(100), &self.cancel).await {
                            return;
                        }
                    }
                }
            }
        }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Option<Known>> {
        // A panic in a delivery leaves `resync` set at worst: moot.
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One transaction: the changes since `known` (or everything), and a
    /// watch on the type's `vs` armed at the same read version.
    async fn read(&self, since: Option<Versionstamp>) -> Result<(Read, Watch), StoreError> {
        let ks = &self.ctx.ks;
        let worker_type = &self.worker_type;
        run(self.ctx.db.as_ref(), self.ctx.read, |tx: Tx| async move {
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
    fn apply(&self, read: Read) {
        let mut known = self.known();
        let known = &mut *known;
        let before = known.as_ref().map(|k| k.vs);
        let changes = match read {
            Read::Full(membership) => {
                // Never step back: a full read is at or after what was
                // delivered.
                let vs = before.map_or(membership.vs, |b| b.max(membership.vs));
                let members = membership.workers.into_iter().collect();
                *known = Some(Known { vs, members, resync: true });
                None
            }
            Read::Changes(changes) => {
                let Some(k) = known.as_mut() else { return };
                for (worker, options) in &changes.changes {
                    match options {
                        Some(options) => k.members.insert(worker.clone(), options.clone()),
                        None => k.members.remove(worker),
                    };
                }
                k.vs = k.vs.max(changes.vs);
                Some(changes.changes)
            }
        };
        let Some(k) = known.as_mut() else { return };
        if before.is_some_and(|b| k.vs <= b) {
            // Nothing to deliver; changes folded in now are not in the
            // next delivery's changes.
            k.resync |= changes.is_some_and(|c| !c.is_empty());
            return;
        }
        let changes = if k.resync { None } else { changes.as_deref() };
        (self.on_update)(MembershipUpdate { worker_type: &self.worker_type, vs: k.vs, members: &k.members, changes });
        k.resync = false;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::log::Discard;
    use crate::store::embedded::{EmbeddedOptions, EmbeddedStore};
    use crate::workers::WorkerSpec;
    use crate::{Node, Settings};

    type Members = BTreeMap<Vec<u8>, Vec<u8>>;
    type Delivery = (Members, Option<Vec<MemberChange>>);

    async fn next(deliveries: &mut tokio::sync::mpsc::UnboundedReceiver<Delivery>) -> Delivery {
        let next = tokio::time::timeout(Duration::from_secs(5), deliveries.recv()).await;
        next.expect("a delivery within 5 s").expect("the watcher is running")
    }

    fn spec(id: &str, options: &str) -> WorkerSpec {
        WorkerSpec { worker_type: b"t".to_vec(), id: id.into(), options_json: options.into(), timeout_s: 60 }
    }

    /// Joins, a leave and new options of a member: the first delivery
    /// has no `changes`, and every later one's turn the members of the
    /// delivery before into its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn changes_turn_the_previous_delivery_into_this_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open the store");
        let node = Node::with_db(store, Settings::default(), Arc::new(Discard));
        let mut regs = Vec::new();
        for i in 0..5 {
            regs.push(node.register_worker(spec(&format!("w{i}"), "{}")).await.expect("register"));
        }
        let (sender, mut deliveries) = tokio::sync::mpsc::unbounded_channel::<Delivery>();
        let _watch = node
            .watch_membership_updates(
                b"t".to_vec(),
                Box::new(move |u| {
                    let _ = sender.send((u.members.clone(), u.changes.map(<[MemberChange]>::to_vec)));
                }),
            )
            .expect("watch");
        let (first, changes) = next(&mut deliveries).await;
        assert_eq!(first.len(), 5);
        assert!(changes.is_none(), "the first delivery is whole");

        regs.push(node.register_worker(spec("w5", "{}")).await.expect("register"));
        drop(regs.remove(0));
        // The same id again: new options of a member.
        regs.push(node.register_worker(spec("w1", "{\"v\":2}")).await.expect("register"));
        let mut expected: Members = (1..6).map(|i| (format!("w{i}").into_bytes(), b"{}".to_vec())).collect();
        expected.insert(b"w1".to_vec(), b"{\"v\":2}".to_vec());

        let mut before = first;
        while before != expected {
            let (members, changes) = next(&mut deliveries).await;
            let changes = changes.expect("a delivery after the first has changes");
            for (worker, options) in changes {
                match options {
                    Some(options) => before.insert(worker, options),
                    None => before.remove(&worker),
                };
            }
            assert_eq!(before, members);
        }
        node.stop().await;
    }
}
