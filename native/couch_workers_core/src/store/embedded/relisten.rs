//! When and how the watcher listens again after its notification sources
//! failed (`listener.rs`): the first attempt [`RELISTEN_FIRST`] after the
//! failure, doubling up to [`RELISTEN_MAX`] while attempts fail or while
//! the sources fail again within [`RELISTEN_MAX`] of the last time; each
//! attempt a new wake socket (its name in the peer list before its file
//! exists) and a new inotify; then [`RELISTEN_GRACE`] of polling while
//! the other handles learn of the new socket. Linux only, as the sources
//! are.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::sources::Sources;
use super::wake::{Peers, WakeSocket};

/// After the sources failed, the first attempt to listen again.
pub(crate) const RELISTEN_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between attempts.
pub(crate) const RELISTEN_MAX: Duration = Duration::from_secs(60);
/// How long the watcher goes on polling after it listens again: longer
/// than a peer without inotify takes to read the directory again
/// (`wake.rs`'s `RESCAN_UNWATCHED`, 1 s).
pub(crate) const RELISTEN_GRACE: Duration = Duration::from_secs(2);

/// What the watcher needs to listen again, and when it tries next.
pub(crate) struct Relisten {
    dir: PathBuf,
    peers: Arc<Peers>,
    wal_name: String,
    /// Bind a wake socket (`EmbeddedOptions::wake_socket`).
    socket: bool,
    /// The next attempt, while not listening.
    next: Option<Instant>,
    /// The wait before the next attempt.
    backoff: Duration,
    /// When it last listened again: a loss soon after keeps the longer
    /// wait, so that a source that fails at once is not rebound, and
    /// logged, every second.
    relistened: Option<Instant>,
}

impl Relisten {
    /// For the sources `sources` of the store in `dir`.
    pub(crate) fn new(dir: &Path, sources: &Sources, socket: bool) -> Relisten {
        Relisten {
            dir: dir.to_path_buf(),
            peers: sources.peers.clone(),
            wal_name: sources.wal_name.clone(),
            socket,
            next: None,
            backoff: RELISTEN_FIRST,
            relistened: None,
        }
    }

    /// The sources failed (or never started): the next attempt in
    /// [`RELISTEN_FIRST`], or later if they came back only a moment ago.
    pub(crate) fn lost(&mut self) {
        let now = Instant::now();
        let backoff = match self.relistened {
            Some(at) if now.duration_since(at) < RELISTEN_MAX => (self.backoff * 2).min(RELISTEN_MAX),
            _ => RELISTEN_FIRST,
        };
        self.retry_in(now, backoff);
    }

    /// The store's directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The time of the next attempt, while one is planned.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.next
    }

    /// New sources, if an attempt is due at `now`: the peer list knows the
    /// new socket's name before its file exists, so a commit of this
    /// handle meanwhile never sends to its own socket.
    pub(crate) fn due_sources(&self, now: Instant) -> Option<Sources> {
        if self.next.is_none_or(|at| now < at) {
            return None;
        }
        let wake = if self.socket {
            let name = WakeSocket::new_name();
            self.peers.set_own(Some(name.clone()));
            WakeSocket::bind_as(&self.dir, &name).ok().map(Arc::new)
        } else {
            None
        };
        Some(Sources { wake, peers: self.peers.clone(), wal_name: self.wal_name.clone() })
    }

    /// The attempt at `now` listens (`true`, through a socket if
    /// `socket`) or failed.
    pub(crate) fn attempted(&mut self, now: Instant, listening: bool, socket: bool) {
        if listening {
            crate::log_event!(
                crate::log::Logger::PROCESS,
                Info,
                "watch_notifications_restored",
                dir = %self.dir.display(),
                wake_socket = socket
            );
            self.next = None;
            self.relistened = Some(now);
        } else {
            self.retry_in(now, (self.backoff * 2).min(RELISTEN_MAX));
        }
    }

    /// It listened again less than [`RELISTEN_GRACE`] ago: the watcher
    /// still polls.
    pub(crate) fn in_grace(&self) -> bool {
        self.relistened.is_some_and(|at| at.elapsed() < RELISTEN_GRACE)
    }

    /// No notifications now: the next attempt in `backoff`, logged (a
    /// loss, a failed attempt: at most one a minute once backed off).
    fn retry_in(&mut self, now: Instant, backoff: Duration) {
        self.backoff = backoff;
        self.next = Some(now + backoff);
        crate::log_event!(
            crate::log::Logger::PROCESS,
            Warning,
            "watch_notifications_failed",
            dir = %self.dir.display(),
            retry_in_ms = u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX)
        );
    }
}
