//! Tells a registration's owner when it becomes its type's leader and
//! when it stops: one watcher per (node, worker type) with registrations
//! on the node.
//!
//! The watcher reads the type's leader (`workers::read_leader`) and arms
//! a watch on the type's membership `vs` in the same transaction: every
//! end of a registration (unregister, owner's death, reap, replacement)
//! and every new one bumps that key, so no change of leader slips in
//! between. What it tells is what the store says: a new leader is told
//! only once the old leader's registration is gone from the store, which
//! for a registration whose node stalled means once a reaper removed it
//! by the liveness rule. The old leader's owner hears `LeaderLost` when
//! its own node's watcher reads the change (for a stalled node, after it
//! runs again), or at once when its registration is ended on this node.
//!
//! Each registration has a [`LeaderSlot`]: what the watcher last saw of
//! it, and the owner's listener. A listener set late hears `Leader` for a
//! leadership it was not told of; each leadership is told once, and its
//! loss only to an owner told of it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::keyspace::Incarnation;
use crate::log_event;
use crate::store::{run, StoreError, Tx, Watch};
use crate::tasks::sleep_or_cancel;
use crate::tasks::supervise::ServiceKind;
use crate::workers::{self, LeaderRecord};

/// What a registration's owner is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderEvent {
    /// The registration leads its type, with this epoch.
    Leader(Vec<u8>),
    /// It no longer leads under this epoch.
    LeaderLost(Vec<u8>),
}

/// Called on a runtime thread with the slot's lock held: it must be quick
/// (send a message).
pub type OnLeaderEvent = Box<dyn Fn(LeaderEvent) + Send + Sync>;

/// One registration's leadership, as its node's watcher last read it.
pub struct LeaderSlot {
    id: Vec<u8>,
    incarnation: Incarnation,
    inner: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    /// The epoch it leads with, as last read.
    leading: Option<Vec<u8>>,
    /// The leadership its owner was told of (and not yet of its loss).
    told: Option<Vec<u8>>,
    listener: Option<OnLeaderEvent>,
    /// The registration ended: nothing more is told.
    ended: bool,
}

impl LeaderSlot {
    pub(crate) fn new(id: Vec<u8>, incarnation: Incarnation) -> Arc<LeaderSlot> {
        Arc::new(LeaderSlot { id, incarnation, inner: Mutex::new(SlotState::default()) })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The watcher's read: `leading` is the epoch if this registration
    /// leads, else `None`.
    fn set(&self, leading: Option<Vec<u8>>) {
        let mut s = self.state();
        if s.ended || s.leading == leading {
            return;
        }
        s.leading = leading;
        tell(&mut s);
    }

    /// Sets (or replaces) the owner's listener; tells it a leadership it
    /// was not told of.
    pub(crate) fn listen(&self, listener: OnLeaderEvent) {
        let mut s = self.state();
        s.listener = Some(listener);
        tell(&mut s);
    }

    /// The registration was removed from the store: a leadership its
    /// owner was told of is lost.
    pub(crate) fn end(&self) {
        let mut s = self.state();
        s.leading = None;
        tell(&mut s);
        s.ended = true;
    }

    /// The epoch this registration leads with, as last read.
    pub fn leading(&self) -> Option<Vec<u8>> {
        self.state().leading.clone()
    }
}

/// Tells the owner what changed since what it was told: the loss of a
/// told leadership first, then a new one.
fn tell(s: &mut SlotState) {
    let Some(listener) = &s.listener else { return };
    if s.told.is_some() && s.told != s.leading {
        if let Some(lost) = s.told.take() {
            listener(LeaderEvent::LeaderLost(lost));
        }
    }
    if s.told.is_none() {
        if let Some(epoch) = &s.leading {
            listener(LeaderEvent::Leader(epoch.clone()));
            s.told = Some(epoch.clone());
        }
    }
}

/// The node's registrations by worker type, and their watchers.
#[derive(Default)]
pub struct Leaderships {
    types: Mutex<HashMap<Vec<u8>, TypeEntry>>,
}

struct TypeEntry {
    slots: Vec<Arc<LeaderSlot>>,
    /// Wakes the watcher to read again (a slot was added: the read before
    /// may have seen its registration already).
    wake: Arc<Notify>,
}

impl Leaderships {
    fn types(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, TypeEntry>> {
        self.types.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds the slot of a registration of `worker_type` (committed before
    /// this call), starting the type's watcher if none runs.
    pub(crate) fn add(self: &Arc<Self>, ctx: &Arc<Context>, worker_type: &[u8], slot: Arc<LeaderSlot>) {
        let mut types = self.types();
        if let Some(entry) = types.get_mut(worker_type) {
            entry.slots.push(slot);
            entry.wake.notify_one();
            return;
        }
        let wake = Arc::new(Notify::new());
        types.insert(worker_type.to_vec(), TypeEntry { slots: vec![slot], wake: wake.clone() });
        let cancel = ctx.cancel.child_token();
        let watcher = LeaderWatcher {
            ctx: ctx.clone(),
            worker_type: worker_type.to_vec(),
            registry: self.clone(),
            wake,
            cancel: cancel.clone(),
        };
        ctx.spawn_supervised(
            ServiceKind::Leadership,
            worker_type.to_vec(),
            cancel,
            None,
            move || watcher.clone().run(),
            None,
        );
    }

    /// Removes a slot (its registration ended); the type's watcher stops
    /// at its next look if it was the last.
    pub(crate) fn remove(&self, worker_type: &[u8], slot: &Arc<LeaderSlot>) {
        if let Some(entry) = self.types().get_mut(worker_type) {
            entry.slots.retain(|s| !Arc::ptr_eq(s, slot));
            entry.wake.notify_one();
        }
    }

    /// Applies a read of the type's leader to its slots. `false`: the type
    /// has no slot left, its entry is gone and the watcher must stop.
    fn apply(&self, worker_type: &[u8], leader: Option<&LeaderRecord>) -> bool {
        let mut types = self.types();
        let Some(entry) = types.get(worker_type) else { return false };
        if entry.slots.is_empty() {
            types.remove(worker_type);
            return false;
        }
        for slot in &entry.slots {
            let leads = leader.filter(|l| l.id == slot.id && l.incarnation == Some(slot.incarnation));
            slot.set(leads.map(|l| l.epoch.clone()));
        }
        true
    }
}

#[derive(Clone)]
struct LeaderWatcher {
    ctx: Arc<Context>,
    worker_type: Vec<u8>,
    registry: Arc<Leaderships>,
    wake: Arc<Notify>,
    cancel: CancellationToken,
}

impl LeaderWatcher {
    /// The watcher's loop; supervised. Ends (and cancels its own token,
    /// so that it is not restarted) once the type has no registration on
    /// the node.
    async fn run(self) {
        let mut failures: u32 = 0;
        loop {
            let read = tokio::select! {
                _ = self.cancel.cancelled() => return,
                read = self.read() => read,
            };
            let watch = match read {
                Ok((leader, watch)) => {
                    failures = 0;
                    if !self.registry.apply(&self.worker_type, leader.as_ref()) {
                        self.cancel.cancel();
                        return;
                    }
                    watch
                }
                Err(e) => {
                    failures += 1;
                    log_event!(self.ctx.log, Warning, "leader_read_failed", "type" = self.worker_type.as_slice(), reason = %e);
                    if !sleep_or_cancel(Duration::from_millis(50u64 << failures.min(5)), &self.cancel).await {
                        return;
                    }
                    continue;
                }
            };
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = self.wake.notified() => {}
                fired = watch => if let Err(e) = fired {
                    if self.cancel.is_cancelled() {
                        return;
                    }
                    // A store hiccup or the watch limit: read again after
                    // a pause rather than spin.
                    log_event!(self.ctx.log, Debug, "leader_watch_failed", "type" = self.worker_type.as_slice(), reason = %e);
                    if !sleep_or_cancel(Duration::from_millis(200), &self.cancel).await {
                        return;
                    }
                },
            }
        }
    }

    /// One transaction: the leader, and a watch on the type's membership
    /// `vs` armed at the same read version.
    async fn read(&self) -> Result<(Option<LeaderRecord>, Watch), StoreError> {
        let (ks, worker_type) = (&self.ctx.ks, &self.worker_type);
        run(self.ctx.db.as_ref(), self.ctx.read, |tx: Tx| async move {
            let leader = workers::read_leader(&tx, ks, worker_type, true).await?;
            let watch: Watch = tx.watch(&ks.membership_vs(worker_type));
            Ok((leader, watch))
        })
        .await
    }
}
