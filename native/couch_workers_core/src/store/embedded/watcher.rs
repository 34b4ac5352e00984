//! The store's watcher thread, `cw-embed-watch` (Linux keeps 15 bytes of
//! a thread name): one per store, it decides when to re-read the watched
//! keys of the registry (`watch.rs`) and fires the watches whose value
//! changed:
//!
//! * at once when woken: a commit through this store that wrote a watched
//!   key (or cleared a range holding one) whose watches it could not fire
//!   itself (`watch.rs`: a local commit fires those that expect the value
//!   it changed), or a new registration (so a change that raced the
//!   registration is not missed: the first read happens after the
//!   registration); a local commit that wrote no watched key leaves the
//!   thread asleep (waking it for every commit cost a third of the raw
//!   commit rate);
//! * when another handle of the store (another node of the host, the CLI)
//!   committed: its post-commit wake-up (`wake.rs`, which the thread
//!   itself receives: `sources.rs`) comes once the commit is visible, so
//!   the thread asks its own connection for `PRAGMA data_version` (which
//!   changes when any other connection, of this or another process, has
//!   committed) once and finds it moved. Only when `data_version` moved
//!   does it read every watched key, in one read transaction, and fire the
//!   watches whose value differs from the registered one. Between
//!   wake-ups it sleeps, waking only every `safety_look` (default
//!   [`SAFETY_LOOK`]): the sweep of dropped watches, and the last resort
//!   for a writer that sends no wake-up (the `sqlite3` shell, an older
//!   build, a crash between commit and send);
//! * where this handle's wake socket could not be bound (`sources.rs`'s
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
//! The thread sleeps in one `ppoll(2)` (`listener.rs`) on all of these:
//! local reasons ring its bell (an eventfd), other handles' wake-ups come
//! on its own wake socket, and the timeout is the next look's.
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

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension};

use super::listener::Listener;
use super::schema;
use super::watch::{WakeCause, WatchHub, WatchTrace};

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
/// main cost (one wake-up a second: bench/RESULTS.md, I1 counted per
/// thread, 2 Dec 2026), hence seconds, not one.
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

/// Starts the watcher thread of a store, on its own connection, waiting
/// on `listener` (made with the hub's bell).
pub(crate) fn spawn_watcher(
    hub: Arc<WatchHub>,
    conn: Connection,
    poll: Polling,
    mut listener: Listener,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("cw-embed-watch".into())
        .spawn(move || watcher_loop(&hub, &conn, poll, &mut listener))
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
    listener: &mut Listener,
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
                let notified = listener.notified();
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
        let woken = listener.wait(due);
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

fn watcher_loop(hub: &WatchHub, conn: &Connection, polling: Polling, listener: &mut Listener) {
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
        let (dirty, cause) = match wait_for_work(hub, listener, sleep, &mut last_purge) {
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
                hub.fire_changed(keys, values, seq_limit, |wal_event, peer_wake| WatchTrace {
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
