//! Watches: the registry of one store's watches, shared by its
//! transactions and its watcher thread (`watcher.rs`).
//!
//! A committed transaction registers each of its watches with the value it
//! saw (its own writes included), and tells the registry which keys it
//! wrote: a commit that wrote a watched key rings the thread's bell, one
//! that wrote none leaves it asleep. The thread reads the watched keys
//! when it has a reason to, and the registry fires each watch whose key's
//! value differs from the one it expects.
//!
//! A local commit that changed a watched key from a value it read before
//! its first write of the key ([`KeyChange`], `notify_commit`'s
//! `changed`) fires the watches expecting that value itself, once it is
//! visible: they saw the key before this commit changed it. That spares
//! the thread's wake-up and read on the path of every local wake-up (a
//! `job_add` waking its node's dispatcher). Watches that expect anything
//! else (another writer changed the key meanwhile) are still left to the
//! thread.
//!
//! Dropped watch futures are noticed (`Sender::is_closed`) and removed.
//! `close` fails every pending watch with [`StoreError::Closed`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::oneshot;

use super::bell::Bell;
use super::sources::Woken;
use crate::store::{StoreError, Watch};

/// What a committed transaction wrote, for [`WatchHub::notify_commit`].
pub(crate) enum Written {
    Key(Vec<u8>),
    /// `clear_range(begin, end)`.
    Range(Vec<u8>, Vec<u8>),
}

/// A key a committed transaction wrote, with its value before that
/// transaction's first write of it (the last any other commit left) and
/// after its commit. With `spare_own_watches` the key's watches take the
/// new value ([`WatchHub::notify_commit`]'s `spared`); else those that
/// expected the old one fire (its `changed`).
pub(crate) struct KeyChange {
    pub(crate) key: Vec<u8>,
    pub(crate) before: Option<Vec<u8>>,
    pub(crate) after: Option<Vec<u8>>,
}

/// The sending half of one watch.
pub(crate) type WatchSender = oneshot::Sender<Result<(), StoreError>>;

/// A new watch: the sender the transaction keeps, the future the caller gets.
pub(crate) fn watch_channel() -> (WatchSender, Watch) {
    let (tx, rx) = oneshot::channel();
    let fut = Box::pin(async move {
        match rx.await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Invalid("the watch's transaction did not commit".into())),
        }
    });
    (tx, fut)
}

pub(super) struct Entry {
    /// The value the creating transaction saw (`None`: missing).
    expected: Option<Vec<u8>>,
    /// Registration order: a read only judges entries registered before it.
    seq: u64,
    pub(super) tx: WatchSender,
}

#[derive(Default)]
pub(super) struct HubState {
    pub(super) watches: HashMap<Vec<u8>, Vec<Entry>>,
    pub(super) next_seq: u64,
    /// Re-read the watched keys without waiting for the next poll.
    pub(super) dirty: bool,
    /// Some process wrote the WAL since the thread last looked (fallback).
    pub(super) wal_written: bool,
    /// Another handle committed since the thread last looked.
    pub(super) peer_woken: bool,
    pub(super) closed: bool,
    /// When the WAL notifier last reported a write (for [`WatchTrace`]).
    last_wal_event: Option<Instant>,
    /// When another handle's wake-up last arrived (for [`WatchTrace`]).
    last_peer_wake: Option<Instant>,
    /// The stages of the last wake-up that fired a watch.
    trace: Option<WatchTrace>,
    /// Looks whose read of `data_version` and the watched keys failed.
    pub(super) failed_reads: u64,
}

/// When the stages of the watcher thread's last wake-up that fired a
/// watch happened, on this process's monotonic clock: what the bench's
/// breakdown of a cross-node wake-up reads (`examples/cw_watch_path.rs`;
/// figures in `bench/RESULTS.md`). A few clock reads per wake-up, under
/// locks the thread takes anyway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchTrace {
    /// The WAL notifier's last report of a write (any process's) before
    /// the wake-up; `None` without WAL notifications (the fallback).
    pub wal_event: Option<Instant>,
    /// The last post-commit wake-up from another handle before this
    /// wake-up (the watcher thread received it); `None` if none came yet.
    pub peer_wake: Option<Instant>,
    /// The thread found `data_version` moved (or was woken by a local
    /// commit or a registration): it is about to read the watched keys.
    pub seen: Instant,
    /// The read of the watched keys ended.
    pub read_done: Instant,
    /// The changed watches were sent their result.
    pub fired: Instant,
    /// What made the thread look this time.
    pub cause: WakeCause,
    /// Looks at `data_version` since the last WAL event or wake-up from
    /// another handle, this one included: 1 when a post-commit wake-up
    /// found the commit at once.
    pub looks: u32,
}

/// What made the watcher thread look (in [`WatchTrace`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeCause {
    /// A commit through this handle that wrote a watched key, or a new
    /// registration.
    Local,
    /// A post-commit wake-up from another handle (`wake.rs`).
    Peer,
    /// A write of the WAL, or a look of the settle window after one (the
    /// fallback without a wake socket).
    Wal,
    /// A timed look: the safety look, or polling.
    Timer,
}

/// The watches of one store, shared by its transactions and its thread.
pub(crate) struct WatchHub {
    state: Mutex<HubState>,
    /// Rung (after the state's lock is released) when the thread has to
    /// look at the state.
    bell: Arc<Bell>,
}

impl WatchHub {
    pub(crate) fn new() -> std::io::Result<WatchHub> {
        Ok(WatchHub { state: Mutex::default(), bell: Arc::new(Bell::new()?) })
    }

    /// The bell, for the watcher thread's `Listener`.
    pub(crate) fn bell(&self) -> Arc<Bell> {
        self.bell.clone()
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, HubState> {
        // A panic while holding this lock leaves consistent data (plain
        // inserts and removals): keep going rather than propagate poison.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Arms a watch of a committed transaction.
    pub(crate) fn register(&self, key: Vec<u8>, expected: Option<Vec<u8>>, tx: WatchSender) {
        let mut st = self.lock();
        if st.closed {
            let _ = tx.send(Err(StoreError::Closed));
            return;
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        st.watches.entry(key).or_default().push(Entry { expected, seq, tx });
        st.dirty = true;
        drop(st);
        self.bell.ring();
    }

    /// Whether a watch waits on `key` now: a transaction about to write
    /// it first reads its value, for [`WatchHub::notify_commit`]'s
    /// `changed`.
    pub(crate) fn is_watched(&self, key: &[u8]) -> bool {
        self.lock().watches.contains_key(key)
    }

    /// A transaction of this store committed `written` (visible now):
    /// check if it touched a watched key. (Its commit also changes
    /// `data_version`, so the next poll re-reads anyway: at most one read
    /// per poll period.)
    ///
    /// A `spared` key's watches that still expect its value from before
    /// the commit (no other commit changed it since they were armed) take
    /// the committed value and keep waiting. A `changed` key's watches
    /// that expect its value from before the commit fire now. Either way
    /// the thread is not woken for them. A watch that expects anything
    /// else (another commit changed the key, before this one or after
    /// it) is left to the thread, which fires it when it reads the key.
    pub(crate) fn notify_commit(&self, written: &[Written], spared: &[KeyChange], changed: &[KeyChange]) {
        let mut st = self.lock();
        if st.watches.is_empty() {
            return;
        }
        let mut settled: Vec<&[u8]> = Vec::new();
        for s in spared {
            let Some(entries) = st.watches.get_mut(&s.key) else { continue };
            for entry in entries.iter_mut().filter(|e| e.expected == s.before) {
                entry.expected = s.after.clone();
            }
            if entries.iter().all(|e| e.expected == s.after) {
                settled.push(&s.key);
            }
        }
        let mut fired = false;
        for c in changed.iter().filter(|c| !spared.iter().any(|s| s.key == c.key)) {
            let moved = c.before != c.after;
            fired |= fire_where(&mut st, &c.key, |e| moved && e.expected == c.before);
            if st.watches.get(&c.key).is_none_or(|left| left.iter().all(|e| e.expected == c.after)) {
                settled.push(&c.key);
            }
        }
        if fired {
            crate::stage::mark("watch_fired");
        }
        if st.dirty {
            return;
        }
        let touched = written.iter().any(|w| match w {
            Written::Key(key) => st.watches.contains_key(key) && !settled.contains(&key.as_slice()),
            Written::Range(begin, end) => st.watches.keys().any(|k| k >= begin && k < end),
        });
        if touched {
            st.dirty = true;
            drop(st);
            self.bell.ring();
        }
    }

    /// What the watcher thread's wait brought (it records it itself): a
    /// wake-up from another handle (its commit is visible), a write of the
    /// WAL (fallback). Only with watches pending is it a reason to look.
    pub(super) fn woken(&self, woken: Woken) {
        if !woken.peer && !woken.wal {
            return;
        }
        let mut st = self.lock();
        let now = Instant::now();
        if woken.peer {
            st.last_peer_wake = Some(now);
        }
        if woken.wal {
            st.last_wal_event = Some(now);
        }
        if st.closed || st.watches.is_empty() {
            return;
        }
        st.peer_woken |= woken.peer;
        st.wal_written |= woken.wal;
    }

    /// Fails every pending watch with `Closed`, refuses new ones, and
    /// tells the thread to stop.
    pub(crate) fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        for (_, entries) in st.watches.drain() {
            for entry in entries {
                let _ = entry.tx.send(Err(StoreError::Closed));
            }
        }
        drop(st);
        self.bell.ring();
    }

    /// The stages of the last wake-up that fired a watch.
    #[cfg(any(test, feature = "internals"))]
    pub(crate) fn trace(&self) -> Option<WatchTrace> {
        self.lock().trace
    }

    /// Looks of the thread whose read failed (busy: a WAL recovery by
    /// another process; an I/O error), for tests and diagnostics.
    #[cfg(any(test, feature = "internals"))]
    pub(crate) fn failed_reads(&self) -> u64 {
        self.lock().failed_reads
    }

    /// Tests only: the watcher's next wait finds its notification sources
    /// failed (as a failing `recv` or inotify read does) and polls until
    /// it listens again.
    #[cfg(feature = "testkit")]
    pub(crate) fn fail_sources(&self) {
        self.bell.fail_sources();
    }

    /// Tests only: [`WatchHub::fail_sources`] was called and the watcher
    /// has not yet taken the failure.
    #[cfg(feature = "testkit")]
    pub(crate) fn sources_failure_pending(&self) -> bool {
        self.bell.sources_failure_pending()
    }

    /// Number of pending watches (for tests and diagnostics): dropped
    /// ones not yet swept out are not counted.
    #[cfg(any(test, feature = "internals"))]
    pub(crate) fn pending(&self) -> usize {
        self.lock().watches.values().flatten().filter(|e| !e.tx.is_closed()).count()
    }
}

impl WatchHub {
    /// Sends the watches whose key's value differs from the one they expect;
    /// if any, records the wake-up's stages (`trace`, given the last WAL event
    /// and the last wake-up from another handle).
    pub(super) fn fire_changed(
        &self,
        keys: Vec<Vec<u8>>,
        values: Vec<Option<Vec<u8>>>,
        seq_limit: u64,
        trace: impl FnOnce(Option<Instant>, Option<Instant>) -> WatchTrace,
    ) {
        let mut st = self.lock();
        let mut fired = false;
        for (key, value) in keys.into_iter().zip(values) {
            fired |= fire_where(&mut st, &key, |e| e.seq < seq_limit && e.expected != value);
        }
        if fired {
            crate::stage::mark("watch_fired");
            st.trace = Some(trace(st.last_wal_event, st.last_peer_wake));
        }
    }
}

/// Fires `key`'s watches for which `fire` holds and drops those whose
/// future is gone; the key leaves the registry with its last watch.
/// Whether any fired.
fn fire_where(st: &mut HubState, key: &[u8], fire: impl Fn(&Entry) -> bool) -> bool {
    let Some(entries) = st.watches.get_mut(key) else { return false };
    let mut fired = false;
    let mut kept = Vec::with_capacity(entries.len());
    for entry in entries.drain(..) {
        if entry.tx.is_closed() {
            continue;
        }
        if fire(&entry) {
            let _ = entry.tx.send(Ok(()));
            fired = true;
        } else {
            kept.push(entry);
        }
    }
    if kept.is_empty() {
        st.watches.remove(key);
    } else {
        *entries = kept;
    }
    fired
}
