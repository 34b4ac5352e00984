//! A waiting acceptor ([`Waiter`]) and where its answer goes
//! ([`AcceptReply`]): the NIF's message, a Rust future's oneshot. Apart
//! from the dispatcher's loop because the callers build these (the
//! service's `accept`, the NIF) and the dispatcher only holds them; a
//! reply that can ring [`GoneSignal`] when its acceptor leaves spares the
//! dispatcher a timer that looks for gone waiters.

use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use crate::error::Error;
use crate::jobs::job::JobHandle;
use crate::keyspace::Incarnation;

/// Rung by a waiter's reply when its acceptor stops waiting (it gave up,
/// or died): the dispatcher wakes and drops it, with no timer to poll on.
/// A ring with no waiter gone costs one look at the waiters.
#[derive(Clone)]
pub struct GoneSignal(pub(super) Arc<Notify>);

impl GoneSignal {
    /// Wakes the dispatcher (never blocks; a ring before it waits is kept).
    pub fn ring(&self) {
        self.0.notify_one();
    }
}

/// Where the outcome of an accept goes. The NIF implements it with a
/// message to the calling process; [`oneshot::Sender`] implements it for
/// Rust callers. Both methods are called on the runtime and must not
/// block.
pub trait AcceptReply: Send + 'static {
    /// Whether the acceptor still waits. Asked right before a job could be
    /// taken for it: a waiter that no longer waits is dropped unanswered.
    fn is_waiting(&self) -> bool {
        true
    }

    /// Called once, when the waiter joins a dispatcher: a reply that will
    /// ring `gone` as soon as [`AcceptReply::is_waiting`] turns false (and
    /// at once if it is false already) keeps it and returns true. The
    /// default returns false: the dispatcher then asks `is_waiting` every
    /// [`PRUNE_INTERVAL`](super::PRUNE_INTERVAL) while it holds this waiter.
    fn signal_gone(&mut self, _gone: GoneSignal) -> bool {
        false
    }

    /// Delivers the outcome. Returns false if the acceptor is gone (the
    /// message could not be sent): a job it carried goes back to pending.
    fn deliver(self: Box<Self>, outcome: Result<JobHandle, Error>) -> bool;
}

impl AcceptReply for oneshot::Sender<Result<JobHandle, Error>> {
    fn is_waiting(&self) -> bool {
        !self.is_closed()
    }

    fn deliver(self: Box<Self>, outcome: Result<JobHandle, Error>) -> bool {
        (*self).send(outcome).is_ok()
    }
}

/// The reply of [`JobService::accept`](crate::jobs::JobService::accept)'s future:
/// a oneshot sender that also rings the dispatcher when the future is
/// dropped unanswered ([`GoneGuard`]).
pub(crate) struct FutureReply {
    sender: oneshot::Sender<Result<JobHandle, Error>>,
    gone: Arc<Mutex<GoneState>>,
}

#[derive(Default)]
struct GoneState {
    gone: bool,
    signal: Option<GoneSignal>,
}

/// Held by the accept future: dropped before its answer came, it rings.
pub(crate) struct GoneGuard(Option<Arc<Mutex<GoneState>>>);

impl GoneGuard {
    /// The answer came: nothing to ring.
    pub fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for GoneGuard {
    fn drop(&mut self) {
        if let Some(state) = self.0.take() {
            let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
            st.gone = true;
            if let Some(signal) = &st.signal {
                signal.ring();
            }
        }
    }
}

/// A reply for a future and the guard the future holds.
pub(crate) fn future_reply() -> (FutureReply, GoneGuard, oneshot::Receiver<Result<JobHandle, Error>>) {
    let (sender, receiver) = oneshot::channel();
    let gone = Arc::new(Mutex::new(GoneState::default()));
    (FutureReply { sender, gone: gone.clone() }, GoneGuard(Some(gone)), receiver)
}

impl AcceptReply for FutureReply {
    fn is_waiting(&self) -> bool {
        !self.sender.is_closed()
    }

    fn signal_gone(&mut self, gone: GoneSignal) -> bool {
        let mut st = self.gone.lock().unwrap_or_else(|e| e.into_inner());
        if st.gone {
            gone.ring();
        }
        st.signal = Some(gone);
        true
    }

    fn deliver(self: Box<Self>, outcome: Result<JobHandle, Error>) -> bool {
        self.sender.send(outcome).is_ok()
    }
}

/// An [`AcceptReply`] from a closure that returns whether it delivered
/// (tests' acceptors).
#[cfg(feature = "internals")]
pub struct ReplyFn<F>(pub F);

#[cfg(feature = "internals")]
impl<F> AcceptReply for ReplyFn<F>
where
    F: FnOnce(Result<JobHandle, Error>) -> bool + Send + 'static,
{
    fn deliver(self: Box<Self>, outcome: Result<JobHandle, Error>) -> bool {
        (self.0)(outcome)
    }
}

/// One waiting acceptor.
pub(crate) struct Waiter {
    pub worker: Vec<u8>,
    /// The registration it accepts for (`None`: whichever holds `worker`):
    /// a waiter outlives the registration it was made for when that ends
    /// while it waits, and must then take nothing of the next one.
    pub incarnation: Option<Incarnation>,
    pub deadline: Instant,
    pub reply: Box<dyn AcceptReply>,
    /// Its reply rings the dispatcher's [`GoneSignal`] (set when it joins).
    pub signals: bool,
}
