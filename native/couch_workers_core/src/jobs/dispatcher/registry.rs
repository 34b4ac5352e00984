//! The node's dispatchers by job type ([`Dispatchers`]): an acceptor's
//! way in. It hands a waiter to its type's dispatcher, or starts one
//! (supervised) when none runs. Apart from the dispatcher's loop because
//! it is the one place shared by every type's dispatcher and every
//! acceptor: the lock under which a waiter is sent and a dispatcher
//! decides to leave, so that no waiter is handed to one that is leaving.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, Notify};

use super::hand_over::Parked;
use super::waiter::Waiter;
use super::Dispatcher;
use crate::context::Context;
use crate::jobs::ops;
use crate::tasks::supervise::ServiceKind;

/// The live dispatchers of a node, by job type. Sending a waiter and a
/// dispatcher's decision to exit both happen under this lock, so a waiter
/// is never handed to a dispatcher that is leaving.
#[derive(Default)]
pub(crate) struct Dispatchers {
    pub(super) map: Mutex<HashMap<Vec<u8>, Entry>>,
    next_id: AtomicU64,
    /// Waiters queued or held by dispatchers (stats).
    pub waiting: Arc<AtomicU64>,
    /// Dispatchers running (stats).
    pub live: Arc<std::sync::atomic::AtomicUsize>,
    /// The pending jobs the node's takes have in flight, every type: its
    /// rounds, `finish_accept` and accepts with timeout 0 pass over each
    /// other's ([`ops::Claims`]).
    pub claims: ops::Claims,
}

/// A running dispatcher: its id (so that one that leaves removes itself
/// only, not a successor) and its way in.
pub(super) struct Entry {
    pub(super) id: u64,
    sender: mpsc::UnboundedSender<Waiter>,
}

impl Dispatchers {
    /// Hands `waiter` to the type's dispatcher, starting one if none runs.
    pub fn submit(self: &Arc<Self>, shared: &Arc<Context>, job_type: &[u8], waiter: Waiter) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let waiter = match map.get(job_type) {
            Some(entry) => match entry.sender.send(waiter) {
                Ok(()) => return,
                // It exited without removing itself (a panic): replace it.
                Err(mpsc::error::SendError(waiter)) => waiter,
            },
            None => waiter,
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = mpsc::unbounded_channel();
        // The receiver is alive: this cannot fail.
        let _ = sender.send(waiter);
        map.insert(job_type.to_vec(), Entry { id, sender });
        // Supervised (`tasks/supervise.rs`): a run that panics parks its
        // queue in `home` (`Dispatcher`'s drop), where the next run takes
        // it up, so no waiter is lost; one that ends (no waiter left, or
        // the node stops) cancels `cancel`, and is not run again.
        let home = Arc::new(Mutex::new(Some(Parked { receiver, waiters: VecDeque::new() })));
        let cancel = shared.cancel.child_token();
        let gone = Arc::new(Notify::new());
        let (s, t, c, registry) = (shared.clone(), job_type.to_vec(), cancel.clone(), self.clone());
        shared.spawn_supervised(
            ServiceKind::Dispatcher,
            job_type.to_vec(),
            cancel,
            None,
            move || {
                let parked = home.lock().unwrap_or_else(|e| e.into_inner()).take();
                let dispatcher = parked.map(|parked| Dispatcher {
                    shared: s.clone(),
                    registry: registry.clone(),
                    job_type: t.clone(),
                    id,
                    receiver: parked.receiver,
                    cancel: c.clone(),
                    waiters: parked.waiters,
                    next_due: None,
                    paused: false,
                    gone: gone.clone(),
                    home: home.clone(),
                    in_round: Vec::new(),
                    round_tokens: Vec::new(),
                    ended: false,
                });
                let cancel = c.clone();
                async move {
                    match dispatcher {
                        Some(d) => d.run().await,
                        // Nothing parked: nothing to serve.
                        None => cancel.cancel(),
                    }
                }
            },
            None,
        );
    }
}
