//! What a registration tells its owner: the events only its heartbeat can
//! find, and that the owner must act on. A reaper may remove a live
//! worker whose node could not write in time; the next heartbeat then
//! registers it again (`Reaped`: its running jobs were given back, their
//! handles are refused). Another registration of the same id may replace
//! it (`Superseded`: it is over).
//!
//! The owner side (the NIF) sets a listener, and may replace it (the
//! Erlang server that holds the registration restarted). An event that
//! happens while no listener is set is kept and given to the next one, so
//! none is lost between a registration's start and its first listener.

use std::sync::Mutex;

/// An event of one registration, for its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerEvent {
    /// The worker was reaped and is registered again, under the same
    /// registration.
    Reaped,
    /// Another registration of the same id holds it now: this one ended.
    Superseded,
    /// The node's heartbeat service keeps failing (it panicked or ended
    /// `FAILING_RESTARTS` times within a minute; `tasks/supervise.rs`):
    /// the worker may be reaped. The service is still restarted; a later
    /// reap is told as `Reaped`.
    HeartbeatFailing,
    /// A job of the worker was taken back: it was not updated for its
    /// activity timeout (`services/activity/`).
    JobTimedOut { job_type: Vec<u8>, job_id: Vec<u8> },
}

/// Called on a runtime thread, with the channel's lock held: it must be
/// quick (send a message) and must not call back into the channel.
pub type OnOwnerEvent = Box<dyn Fn(OwnerEvent) + Send + Sync>;

/// The channel of one registration, from its heartbeat to its owner.
#[derive(Default)]
pub struct OwnerEvents {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    listener: Option<OnOwnerEvent>,
    /// Events that found no listener (each kind at most once: the owner
    /// needs to know that it happened, not how often).
    missed_reaped: bool,
    missed_superseded: bool,
    missed_failing: bool,
    /// Jobs taken back while no listener was set, each told once.
    missed_timeouts: Vec<OwnerEvent>,
    superseded: bool,
}

impl OwnerEvents {
    pub fn emit(&self, event: OwnerEvent) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if event == OwnerEvent::Superseded {
            inner.superseded = true;
        }
        match &inner.listener {
            Some(listener) => listener(event),
            None => match event {
                OwnerEvent::Reaped => inner.missed_reaped = true,
                OwnerEvent::Superseded => inner.missed_superseded = true,
                OwnerEvent::HeartbeatFailing => inner.missed_failing = true,
                timed_out @ OwnerEvent::JobTimedOut { .. } => inner.missed_timeouts.push(timed_out),
            },
        }
    }

    /// Sets (or replaces) the listener, giving it first the events that
    /// found none. Returns whether the registration was superseded: then
    /// the listener was told already or will not be told again.
    pub fn listen(&self, listener: OnOwnerEvent) -> bool {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if std::mem::take(&mut inner.missed_reaped) {
            listener(OwnerEvent::Reaped);
        }
        if std::mem::take(&mut inner.missed_failing) {
            listener(OwnerEvent::HeartbeatFailing);
        }
        for timed_out in std::mem::take(&mut inner.missed_timeouts) {
            listener(timed_out);
        }
        if std::mem::take(&mut inner.missed_superseded) {
            listener(OwnerEvent::Superseded);
        }
        inner.listener = Some(listener);
        inner.superseded
    }

    pub fn is_superseded(&self) -> bool {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).superseded
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex as StdMutex};

    fn recorder() -> (OnOwnerEvent, Arc<StdMutex<Vec<OwnerEvent>>>) {
        let seen = Arc::new(StdMutex::new(Vec::new()));
        let s = seen.clone();
        (Box::new(move |e| s.lock().unwrap().push(e)), seen)
    }

    #[test]
    fn events_without_a_listener_go_to_the_next_one_once() {
        let events = OwnerEvents::default();
        events.emit(OwnerEvent::Reaped);
        events.emit(OwnerEvent::Reaped);
        let (first, seen_first) = recorder();
        assert!(!events.listen(first));
        assert_eq!(*seen_first.lock().unwrap(), vec![OwnerEvent::Reaped]);
        let (second, seen_second) = recorder();
        assert!(!events.listen(second));
        events.emit(OwnerEvent::Superseded);
        assert_eq!(*seen_first.lock().unwrap(), vec![OwnerEvent::Reaped], "a replaced listener hears nothing more");
        assert_eq!(*seen_second.lock().unwrap(), vec![OwnerEvent::Superseded]);
        assert!(events.is_superseded());
        let (third, seen_third) = recorder();
        assert!(events.listen(third), "a later listener learns that it was superseded");
        assert!(seen_third.lock().unwrap().is_empty(), "but is not told again");
    }
}
