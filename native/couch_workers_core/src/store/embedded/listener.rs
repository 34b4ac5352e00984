//! What the store's one watcher thread, `cw-embed-watch` (`watcher.rs`),
//! sleeps on: its [`Bell`] (`bell.rs`: this handle's own reasons to look,
//! and `close`) and, with `wal_notify`, its notification sources
//! (`sources.rs`: other handles' wake-ups, `DIR/wake`'s changes, or
//! inotify on the WAL as the fallback), on Linux in one `ppoll(2)`, with
//! the timeout of the watcher's schedule (safety look, settle steps,
//! polling). The wake-up of another process's commit thus reaches the
//! thread that reads the watched keys directly, with no thread hand-off in
//! between (a second thread that received it and rang the watcher cost one
//! more hand-off on every cross-node wake-up: bench/RESULTS.md, "the
//! one-thread watcher").
//!
//! When the sources fail (a failing read, an inotify queue overflow, this
//! handle's socket file or `DIR/wake` removed), the watcher polls at once
//! and the [`Listener`] listens again a second later (`relisten.rs`:
//! backing off to a minute while that fails, or while the sources fail
//! again soon after): a new socket in `DIR/wake` (recreated if need be), a
//! new inotify. The other handles learn of the new socket when their
//! watcher threads read the directory's event (or its next timed read,
//! without inotify: about a second), so the watcher goes on polling for a
//! grace after listening again: a commit in between, whose wake-up went
//! nowhere, is still seen at once. Polling until the handle closed instead
//! kept an idle node at hundreds of wake-ups a second (bench/RESULTS.md,
//! "a handle listens again after its notifications failed").
//!
//! Either way a quiet store costs nothing: nothing wakes the thread while
//! no process writes. Without a socket or inotify (not Linux, or
//! `wal_notify` off) it waits on the bell alone (a condition variable off
//! Linux) and the watcher polls.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use super::bell::Bell;
#[cfg(target_os = "linux")]
use super::relisten::Relisten;
#[cfg(target_os = "linux")]
use super::sources::{self, OpenSources};
use super::sources::{Sources, Woken};

/// The watcher thread's side: its bell and, while they work, its sources.
pub(crate) struct Listener {
    bell: Arc<Bell>,
    #[cfg(target_os = "linux")]
    listen: Option<OpenSources>,
    /// How to listen again once the sources failed (`None`: there were
    /// none to begin with).
    #[cfg(target_os = "linux")]
    relisten: Option<Relisten>,
}

impl Listener {
    /// The listener of the store in `dir`: the bell alone without `sources`
    /// (or, until they can start, where none of them can: the watcher
    /// then polls). `socket`: bind a new wake socket when listening again.
    pub(crate) fn new(dir: &Path, sources: Option<Sources>, socket: bool, bell: Arc<Bell>) -> Listener {
        #[cfg(target_os = "linux")]
        {
            let relisten = sources.as_ref().map(|s| Relisten::new(dir, s, socket));
            let listen = sources.and_then(|s| OpenSources::new(dir, s));
            let mut listener = Listener { bell, listen, relisten };
            if listener.listen.is_none() {
                listener.lost();
            }
            listener
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (dir, sources, socket);
            Listener { bell }
        }
    }

    /// The sources failed (or never started): plan the next attempt.
    #[cfg(target_os = "linux")]
    fn lost(&mut self) {
        if let Some(r) = self.relisten.as_mut() {
            r.lost();
        }
    }

    /// Listens again if it is time to: `true` when the sources run again.
    #[cfg(target_os = "linux")]
    fn try_relisten(&mut self, now: Instant) -> bool {
        let Some(r) = self.relisten.as_mut() else { return false };
        let Some(sources) = r.due_sources(now) else { return false };
        self.listen = OpenSources::new(r.dir(), sources);
        let socket = self.listen.as_ref().is_some_and(|l| l.has_socket());
        r.attempted(now, self.listen.is_some(), socket);
        self.listen.is_some()
    }

    /// Notifications run: other handles' commits wake the thread, which
    /// needs no polling (not yet in the grace after listening again).
    pub(crate) fn notified(&self) -> bool {
        #[cfg(target_os = "linux")]
        {
            self.listen.is_some() && !self.relisten.as_ref().is_some_and(Relisten::in_grace)
        }
        #[cfg(not(target_os = "linux"))]
        {
            false
        }
    }

    /// Sleeps until the bell rings, a source has news, or `deadline`
    /// (`None`: no deadline). May return early with nothing (as it does
    /// when it has just listened again: the watcher, still polling for
    /// `relisten.rs`'s grace, plans its next look).
    pub(crate) fn wait(&mut self, deadline: Option<Instant>) -> Woken {
        #[cfg(target_os = "linux")]
        {
            if self.listen.is_none() && self.try_relisten(Instant::now()) {
                return Woken::default();
            }
            let listening = self.listen.is_some();
            // Not listening: wake for the next attempt, even with no watch
            // to poll for (the wait would have no deadline).
            let relisten_at = if listening { None } else { self.relisten.as_ref().and_then(Relisten::next) };
            let deadline = match (deadline, relisten_at) {
                (Some(d), Some(r)) => Some(d.min(r)),
                (d, r) => d.or(r),
            };
            let woken = sources::wait(&self.bell, &mut self.listen, deadline);
            if listening && self.listen.is_none() {
                self.lost();
            }
            woken
        }
        #[cfg(not(target_os = "linux"))]
        {
            self.bell.wait(deadline);
            Woken::default()
        }
    }
}
