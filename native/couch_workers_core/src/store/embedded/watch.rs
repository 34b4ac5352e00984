//! Watches: the registry and the store's watcher thread.
//!
//! A committed transaction registers each of its watches with the value it
//! saw (its own writes included). One thread per store, `cw-embed-watch`
//! (Linux keeps 15 bytes of a thread name), decides when to re-read the
//! watched keys:
//!
//! * at once when woken: a commit through this store that wrote a watched
//!   key (or cleared a range holding one), or a new registration (so a
//!   change that raced the registration is not missed: the first read
//!   happens after the registration); a local commit that wrote no watched
//!   key leaves the thread asleep (waking it for every commit cost a third
//!   of the raw commit rate);
//! * when another handle of the store (another node of the host, the CLI)
//!   committed: its post-commit wake-up (`wake.rs`, which the thread
//!   itself receives: `wait.rs`) comes once the commit is visible, so the thread asks its
//!   own connection for `PRAGMA data_version` (which changes when any
//!   other connection, of this or another process, has committed) once
//!   and finds it moved. Only when `data_version` moved does it read
//!   every watched key, in one read transaction, and fire the watches
//!   whose value differs from the registered one. Between wake-ups it
//!   sleeps, waking only every `safety_look` (default [`SAFETY_LOOK`]):
//!   the sweep of dropped watches, and the last resort for a writer that
//!   sends no wake-up (the `sqlite3` shell, an older build, a crash
//!   between commit and send);
//! * where this handle's wake socket could not be bound (`wait.rs`'s
//!   fallback), when any process wrote the store's WAL (inotify): the
//!   frames are written before the commit is visible, so it keeps asking
//!   for [`SETTLE`] after the last such write, first after
//!   [`SETTLE_FIRST`] and then at doubling intervals up to
//!   [`SETTLE_MAX_STEP`] (the kernel also merges writes that follow each
//!   other into one event);
//! * where inotify is unavailable, it polls `data_version` every
//!   `watch_poll` instead, and every `watch_poll_idle` after [`ACTIVE_FOR`]
//!   without any change, until the next change.
//!
//! The thread sleeps in one `ppoll(2)` (`wait.rs`) on all of these: local
//! reasons ring its bell (an eventfd), other handles' wake-ups come on its
//! own wake socket, and the timeout is the next look's.
//!
//! A look whose read fails (the store busy: another process recovering
//! the WAL; an I/O error) is tried again soon, at doubling intervals from
//! [`RETRY_FIRST`] up to [`RETRY_MAX`] while it keeps failing: what made
//! the thread look will not come again, and with notifications the next
//! look would otherwise be the safety look.
//!
//! With no watch registered the thread sleeps until one is (no polling at
//! all; wake-ups from other handles are still read, and need no look).
//! One poll costs a few µs (three syscalls: the WAL-index read lock
//! taken and dropped, an fstat) plus a timed wake-up (`tests/embedded_perf.rs`
//! measures the thread's CPU with a pending watch and no commits; figures
//! in `bench/RESULTS.md`).
//!
//! Dropped watch futures are noticed (`Sender::is_closed`) and removed.
//! `close` fails every pending watch with [`StoreError::Closed`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension};
use tokio::sync::oneshot;

use super::schema;
use super::wait::{Bell, Waiter, Woken};
use crate::store::{StoreError, Watch};

/// What a committed transaction wrote, for [`WatchHub::notify_commit`].
pub(crate) enum Written {
    Key(Vec<u8>),
    /// `clear_range(begin, end)`.
    Range(Vec<u8>, Vec<u8>),
}

/// A key a committed transaction wrote with `spare_own_watches`: its
/// value before that transaction's write (the last any other commit left)
/// and after.
pub(crate) struct Spared {
    pub(crate) key: Vec<u8>,
    pub(crate) before: Option<Vec<u8>>,
    pub(crate) after: Option<Vec<u8>>,
}

/// The sending half of one watch.
pub(crate) type WatchSender = oneshot::Sender<Result<(), StoreError>>;

/// How often dropped watch futures are swept out when nothing changes.
const PURGE_EVERY: Duration = Duration::from_millis(100);

/// How long after the last change the thread keeps polling fast (when it
/// polls: without WAL notifications).
pub(crate) const ACTIVE_FOR: Duration = Duration::from_millis(250);

/// How long after the last WAL write the thread keeps looking at
/// `data_version`: covers a writer descheduled between writing its frames
/// and publishing them, and writes merged into one event.
pub(crate) const SETTLE: Duration = Duration::from_millis(20);

/// The first look after a WAL write: most commits are visible by then.
pub(crate) const SETTLE_FIRST: Duration = Duration::from_micros(50);

/// The longest interval between two looks of a settle window.
pub(crate) const SETTLE_MAX_STEP: Duration = Duration::from_millis(4);

/// The first retry after a failed read of the watched keys (at least: the
/// active polling interval if longer).
const RETRY_FIRST: Duration = Duration::from_millis(1);

/// The longest interval between retries while reads keep failing: a
/// change is seen within about this of the store becoming readable again.
const RETRY_MAX: Duration = Duration::from_millis(32);

/// With notifications (wake sockets or the WAL's), the longest sleep
/// between looks by default (`EmbeddedOptions::safety_look`). Every
/// writer of this code sends a wake-up, so this look only bounds how late
/// one that sends none is seen; on an idle node it was the watcher's
/// main cost (one wake-up a second: bench/RESULTS.md, "Session 9: I1"),
/// hence seconds, not one.
pub const SAFETY_LOOK: Duration = Duration::from_secs(10);

/// How often the watcher thread polls `PRAGMA data_version`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Polling {
    /// Within [`ACTIVE_FOR`] of the last change seen.
    pub(crate) active: Duration,
    /// After that.
    pub(crate) idle: Duration,
    /// With notifications: the longest sleep between looks.
    pub(crate) safety: Duration,
}

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

struct Entry {
    /// The value the creating transaction saw (`None`: missing).
    expected: Option<Vec<u8>>,
    /// Registration order: a read only judges entries registered before it.
    seq: u64,
    tx: WatchSender,
}

#[derive(Default)]
struct HubState {
    watches: HashMap<Vec<u8>, Vec<Entry>>,
    next_seq: u64,
    /// Re-read the watched keys without waiting for the next poll.
    dirty: bool,
    /// Some process wrote the WAL since the thread last looked (fallback).
    wal_written: bool,
    /// Another handle committed since the thread last looked.
    peer_woken: bool,
    closed: bool,
    /// When the WAL notifier last reported a write (for [`WatchTrace`]).
    last_wal_event: Option<Instant>,
    /// When another handle's wake-up last arrived (for [`WatchTrace`]).
    last_peer_wake: Option<Instant>,
    /// The stages of the last wake-up that fired a watch.
    trace: Option<WatchTrace>,
    /// Looks whose read of `data_version` and the watched keys failed.
    failed_reads: u64,
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

    /// The bell, for the watcher thread's [`Waiter`].
    pub(crate) fn bell(&self) -> Arc<Bell> {
        self.bell.clone()
    }

    fn lock(&self) -> MutexGuard<'_, HubState> {
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

    /// A transaction of this store committed `written`: check now if it
    /// touched a watched key. (Its commit also changes `data_version`, so
    /// the next poll re-reads anyway: at most one read per poll period.)
    ///
    /// A `spared` key's watches that still expect its value from before
    /// the commit (no other commit changed it since they were armed) take
    /// the committed value and keep waiting; the thread is not woken for
    /// it. A watch that expects anything else (another commit changed the
    /// key, before this one or after it) is left to the thread, which
    /// fires it when it reads the key.
    pub(crate) fn notify_commit(&self, written: &[Written], spared: &[Spared]) {
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
    fn woken(&self, woken: Woken) {
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
    pub(crate) fn trace(&self) -> Option<WatchTrace> {
        self.lock().trace
    }

    /// Looks of the thread whose read failed (busy: a WAL recovery by
    /// another process; an I/O error), for tests and diagnostics.
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
    pub(crate) fn pending(&self) -> usize {
        self.lock().watches.values().flatten().filter(|e| !e.tx.is_closed()).count()
    }
}

/// Starts the watcher thread of a store, on its own connection, waiting
/// on `waiter` (made with the hub's bell).
pub(crate) fn spawn_watcher(
    hub: Arc<WatchHub>,
    conn: Connection,
    poll: Polling,
    mut waiter: Waiter,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("cw-embed-watch".into())
        .spawn(move || watcher_loop(&hub, &conn, poll, &mut waiter))
}

/// What one wake-up of the thread should do.
enum Wake {
    Stop,
    /// `dirty`: re-read even if `data_version` did not change; `wal`: a
    /// process wrote the WAL (start a settle window); `peer`: another
    /// handle's commit is visible (look once).
    Check {
        dirty: bool,
        wal: bool,
        peer: bool,
    },
}

/// Sleeps until there is something to look at: a flag set (a ring of the
/// bell, or what the wait brought), or the next look's time. `sleep` gives
/// that time's distance (given whether notifications run); it is fixed at
/// the first pass, so wake-ups that bring nothing to look at (a peer list
/// change, a wake-up with no watch pending) do not postpone the look. It
/// is planned again when the notifications fail during the wait: the
/// safety look planned with them would leave the first change after the
/// failure, whose wake-up nobody reads any more, unseen until then.
fn wait_for_work(
    hub: &WatchHub,
    waiter: &mut Waiter,
    sleep: impl Fn(bool) -> Duration,
    last_purge: &mut Instant,
) -> Wake {
    // The next look's time, and whether notifications ran when planned.
    let mut deadline: Option<(Instant, bool)> = None;
    let mut st = loop {
        let due = {
            let st = hub.lock();
            if st.closed {
                return Wake::Stop;
            }
            if st.dirty || st.wal_written || st.peer_woken {
                break st;
            }
            if st.watches.is_empty() {
                // Idle: nothing to poll for until a registration rings.
                None
            } else {
                let notified = waiter.notified();
                let due = match deadline {
                    Some((due, planned_notified)) if planned_notified == notified => due,
                    _ => {
                        let due = Instant::now() + sleep(notified);
                        deadline = Some((due, notified));
                        due
                    }
                };
                if Instant::now() >= due {
                    break st;
                }
                Some(due)
            }
        };
        let woken = waiter.wait(due);
        hub.woken(woken);
    };
    let dirty = std::mem::take(&mut st.dirty);
    let wal = std::mem::take(&mut st.wal_written);
    let peer = std::mem::take(&mut st.peer_woken);
    if dirty || last_purge.elapsed() >= PURGE_EVERY {
        *last_purge = Instant::now();
        st.watches.retain(|_, entries| {
            entries.retain(|e| !e.tx.is_closed());
            !entries.is_empty()
        });
    }
    Wake::Check { dirty, wal, peer }
}

fn watcher_loop(hub: &WatchHub, conn: &Connection, polling: Polling, waiter: &mut Waiter) {
    let mut last_data_version: Option<i64> = None;
    let mut last_purge = Instant::now();
    let mut last_change = Instant::now();
    // The settle window after the last WAL write, and the next interval.
    let mut settle_until: Option<Instant> = None;
    let mut settle_step = SETTLE_FIRST;
    let mut looks: u32 = 0;
    // After a failed read: when to try again (doubling up to RETRY_MAX).
    let mut retry: Option<Duration> = None;
    loop {
        let settling = settle_until.is_some_and(|t| Instant::now() < t);
        let sleep = |notified: bool| {
            let planned = if notified {
                if settling {
                    settle_step
                } else {
                    polling.safety
                }
            } else if last_change.elapsed() < ACTIVE_FOR {
                polling.active
            } else {
                polling.idle.max(polling.active)
            };
            retry.map_or(planned, |r| r.min(planned))
        };
        let (dirty, cause) = match wait_for_work(hub, waiter, sleep, &mut last_purge) {
            Wake::Stop => return,
            Wake::Check { dirty, wal, peer } => {
                let cause = if dirty {
                    WakeCause::Local
                } else if peer {
                    WakeCause::Peer
                } else if wal || settling {
                    WakeCause::Wal
                } else {
                    WakeCause::Timer
                };
                if wal {
                    settle_until = Some(Instant::now() + SETTLE);
                    settle_step = SETTLE_FIRST;
                    looks = 0;
                } else if peer {
                    // The commit is visible already: one look finds it.
                    looks = 0;
                } else if settling {
                    settle_step = (settle_step * 2).min(SETTLE_MAX_STEP);
                }
                (dirty, cause)
            }
        };
        // Read before the values: a commit in between changes it again, so
        // the next poll re-reads (a spare read, never a missed change).
        let data_version = schema::data_version(conn).ok();
        looks = looks.saturating_add(1);
        if !dirty && data_version.is_some() && data_version == last_data_version {
            continue;
        }
        last_change = Instant::now();
        let (keys, seq_limit) = {
            let st = hub.lock();
            (st.watches.keys().cloned().collect::<Vec<_>>(), st.next_seq)
        };
        if keys.is_empty() {
            last_data_version = data_version;
            continue;
        }
        let seen = Instant::now();
        crate::stage::mark("watcher_reads");
        match read_values(conn, &keys) {
            Ok(values) => {
                retry = None;
                last_data_version = data_version;
                let read_done = Instant::now();
                fire_changed(hub, keys, values, seq_limit, |wal_event, peer_wake| WatchTrace {
                    wal_event,
                    peer_wake,
                    seen,
                    read_done,
                    fired: Instant::now(),
                    cause,
                    looks,
                });
            }
            Err(_) => {
                // Busy (a WAL reset or recovery by another process) or an
                // I/O error: what made this look (a wake-up, a
                // registration) will not come again, so try again soon,
                // whether notifications run or not (with them the next
                // look would be the safety look). Never spin: the retries
                // space out, up to RETRY_MAX while the store stays so.
                hub.lock().failed_reads += 1;
                last_data_version = None;
                retry = Some(retry.map_or(polling.active.max(RETRY_FIRST), |r| (r * 2).min(RETRY_MAX)));
            }
        }
    }
}

/// The current values of `keys`, in one read transaction.
fn read_values(conn: &Connection, keys: &[Vec<u8>]) -> rusqlite::Result<Vec<Option<Vec<u8>>>> {
    schema::exec_cached(conn, "BEGIN DEFERRED")?;
    let result = (|| {
        let mut stmt = conn.prepare_cached(schema::SQL_GET)?;
        keys.iter()
            .map(|k| stmt.query_row([k], |row| row.get::<_, Vec<u8>>(0)).optional())
            .collect::<rusqlite::Result<Vec<_>>>()
    })();
    let end = schema::exec_cached(conn, if result.is_ok() { "COMMIT" } else { "ROLLBACK" });
    let values = result?;
    end?;
    Ok(values)
}

/// Sends the watches whose key's value differs from the one they expect;
/// if any, records the wake-up's stages (`trace`, given the last WAL event
/// and the last wake-up from another handle).
fn fire_changed(
    hub: &WatchHub,
    keys: Vec<Vec<u8>>,
    values: Vec<Option<Vec<u8>>>,
    seq_limit: u64,
    trace: impl FnOnce(Option<Instant>, Option<Instant>) -> WatchTrace,
) {
    let mut st = hub.lock();
    let mut fired = false;
    for (key, value) in keys.into_iter().zip(values) {
        let Some(entries) = st.watches.get_mut(&key) else { continue };
        let mut kept = Vec::with_capacity(entries.len());
        for entry in entries.drain(..) {
            if entry.tx.is_closed() {
                continue;
            }
            if entry.seq < seq_limit && entry.expected != value {
                let _ = entry.tx.send(Ok(()));
                fired = true;
            } else {
                kept.push(entry);
            }
        }
        if kept.is_empty() {
            st.watches.remove(&key);
        } else {
            *entries = kept;
        }
    }
    if fired {
        crate::stage::mark("watch_fired");
        st.trace = Some(trace(st.last_wal_event, st.last_peer_wake));
    }
}
