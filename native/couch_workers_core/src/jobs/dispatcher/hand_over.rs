//! The supervised restart's hand-over: a dispatcher's run that panics
//! (or is dropped with the runtime) parks its queue ([`Parked`]) where
//! the next run takes it up, so no waiter is lost and none loses its
//! place; what the round in flight may have taken goes back to pending.
//! Apart from the dispatcher's loop because it runs in `Drop`, whichever
//! way a run ends (one that returned only stops its supervision).

use std::collections::VecDeque;

use tokio::sync::mpsc;

use super::give_back::reclaim;
use super::waiter::Waiter;
use super::Dispatcher;


/// A dispatcher's queue between two runs.
pub(super) struct Parked {
    pub(super) receiver: mpsc::UnboundedReceiver<Waiter>,
    pub(super) waiters: VecDeque<Waiter>,
}


impl Drop for Dispatcher {
    fn drop(&mut self) {
        if self.ended {
            // No waiter left, or the node stops: not run again.
            self.cancel.cancel();
            return;
        }
        // A panic (or the task dropped with the runtime): the next run serves the same waiters, in the same
        // order; what the round in flight may have taken goes back.
        let tokens = std::mem::take(&mut self.round_tokens);
        if !tokens.is_empty() {
            reclaim(&self.shared, self.job_type.clone(), tokens);
        }
        let mut waiters: VecDeque<Waiter> = std::mem::take(&mut self.in_round).into();
        waiters.extend(self.waiters.drain(..));
        let (_, closed) = mpsc::unbounded_channel();
        let receiver = std::mem::replace(&mut self.receiver, closed);
        *self.home.lock().unwrap_or_else(|e| e.into_inner()) = Some(Parked { receiver, waiters });
    }
}
