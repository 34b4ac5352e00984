//! WAL checkpoints off the commit path: the `cw-embed-ckpt` thread.
//!
//! SQLite's automatic checkpoint runs inside the commit that grows the WAL
//! past 1,000 pages, fsyncs included: that commit's caller pays for it (a
//! tail of slow commits). A background PASSIVE checkpoint alone is no
//! answer either: under a steady stream of commits it never catches up
//! with the end of the WAL, SQLite never restarts the log, and the WAL
//! grows without bound. So the two are combined (figures for each:
//! bench/RESULTS.md, "Figures the module docs rely on"):
//!
//! * every connection has the automatic checkpoint off; the write
//!   connection's WAL hook reports the WAL's size after each of its
//!   commits and wakes this thread each time the WAL has grown by
//!   [`EVERY`] frames since the last pass (or since it started over);
//! * the thread runs a PASSIVE checkpoint on its own connection, outside
//!   every lock of this process: it copies the bulk of the WAL and pays the
//!   fsyncs while the writers go on. When it reaches the end of the WAL
//!   (writers were quiet meanwhile), the next write transaction starts the
//!   log over (SQLite restarts a fully checkpointed WAL when a writer
//!   begins and no reader still uses it);
//! * when it does not, and the WAL has passed [`RESTART_AT`] frames, it
//!   takes the store's in-process writer lock and checkpoints again: only
//!   the frames written since remain, and with no local writer appending
//!   it reaches the end;
//! * a pass waits for a quiet moment, [`QUIET`] without a local commit
//!   (up to [`RESTART_AT`] frames): its fsyncs slow down the commits
//!   that run beside them (J3's `job_add` p99 is several times higher with
//!   passes started at once), while a pass started in the gap after a
//!   burst is over before the next;
//! * passes are at least [`MIN_INTERVAL`] apart.
//!
//! Other processes' writers are not held back by the lock; they append
//! while the locked pass runs, which can keep it short of the end. The
//! next pass tries again; every process runs this thread for its own
//! commits.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;

/// The WAL's growth (frames) that wakes the thread: SQLite's automatic
/// checkpoint interval.
pub(crate) const EVERY: u32 = 1_000;
/// A WAL this long after an unlocked pass gets the locked pass that lets
/// the log restart (frames; 4 MB with the store's 1 KiB pages).
pub(crate) const RESTART_AT: u32 = 4_000;
/// How long without a local commit makes a quiet moment.
const QUIET: Duration = Duration::from_millis(1);
/// The shortest time between two passes.
const MIN_INTERVAL: Duration = Duration::from_millis(5);

#[derive(Default)]
struct State {
    requested: bool,
    closed: bool,
}

/// What the write connection's WAL hook and the thread share.
pub(crate) struct CheckpointSignal {
    state: Mutex<State>,
    wake: Condvar,
    /// The WAL's size after the last local commit (frames), for tests and
    /// diagnostics.
    wal_frames: AtomicU32,
    /// SQLite commits of the write connection (a group commit is one).
    commits: AtomicU64,
    /// The WAL length that asks for the next pass.
    next_at: AtomicU32,
}

impl Default for CheckpointSignal {
    fn default() -> Self {
        CheckpointSignal {
            state: Mutex::default(),
            wake: Condvar::new(),
            wal_frames: AtomicU32::new(0),
            commits: AtomicU64::new(0),
            next_at: AtomicU32::new(EVERY),
        }
    }
}

impl CheckpointSignal {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Called by the WAL hook after each commit of the write connection.
    pub(crate) fn committed(&self, wal_frames: u32) {
        let before = self.wal_frames.swap(wal_frames, Ordering::Relaxed);
        self.commits.fetch_add(1, Ordering::Relaxed);
        if wal_frames < before {
            // The WAL started over.
            self.next_at.store(EVERY, Ordering::Relaxed);
        }
        if wal_frames < self.next_at.load(Ordering::Relaxed) {
            return;
        }
        let mut st = self.lock();
        if !st.requested {
            st.requested = true;
            self.wake.notify_one();
        }
    }

    /// The WAL's size after the last local commit, in frames.
    pub(crate) fn wal_frames(&self) -> u32 {
        self.wal_frames.load(Ordering::Relaxed)
    }

    /// SQLite commits of the write connection so far.
    pub(crate) fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_all();
    }

    /// Sleeps until no local commit came for [`QUIET`], or the WAL has
    /// grown past [`RESTART_AT`] frames (a steady writer is never quiet).
    fn wait_quiet(&self) {
        let mut seen = self.commits();
        loop {
            std::thread::sleep(QUIET);
            let now = self.commits();
            if now == seen || self.wal_frames() >= RESTART_AT {
                return;
            }
            seen = now;
        }
    }

    /// Waits for a request; `false` once closed.
    fn wait(&self) -> bool {
        let mut st = self.lock();
        while !st.requested && !st.closed {
            st = self.wake.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.requested = false;
        !st.closed
    }
}

/// Installs the hook on the write connection (and turns its automatic
/// checkpoint off: the hook replaces it). SQLite runs it after each commit
/// that wrote frames, once the commit is visible and the write lock is
/// released; `after_commit` runs there too (the wake-ups of the other
/// handles, `wake.rs`).
pub(crate) fn install_hook(
    writer: &mut Connection,
    signal: Arc<CheckpointSignal>,
    after_commit: impl Fn() + Send + 'static,
) -> rusqlite::Result<()> {
    writer.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, frames: std::os::raw::c_int| {
        signal.committed(u32::try_from(frames).unwrap_or(0));
        after_commit();
        Ok(())
    }))
}

/// Starts the thread. `writer` is the store's in-process writer lock, held
/// for the locked pass.
pub(crate) fn spawn_checkpointer(
    signal: Arc<CheckpointSignal>,
    conn: Connection,
    writer: Arc<tokio::sync::Mutex<Connection>>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name("cw-embed-ckpt".into()).spawn(move || checkpoint_loop(&signal, &conn, &writer))
}

fn checkpoint_loop(signal: &CheckpointSignal, conn: &Connection, writer: &tokio::sync::Mutex<Connection>) {
    while signal.wait() {
        signal.wait_quiet();
        // A failed pass (busy: another process checkpoints; or an I/O
        // error) only leaves the WAL longer: nothing committed is lost,
        // the next commit asks again, and an I/O error shows in the
        // writers' own commits.
        if let Ok((log, done)) = passive(conn) {
            signal.next_at.store(log.saturating_add(EVERY), Ordering::Relaxed);
            // The pass copies what the WAL held when it began: commits
            // made meanwhile (the hook saw the WAL grow) are still to copy.
            let behind = done < log || signal.wal_frames() > log;
            if behind && log >= RESTART_AT {
                // No local writer may append while this pass runs.
                let _held = writer.blocking_lock();
                let _ = passive(conn);
            }
        }
        std::thread::sleep(MIN_INTERVAL);
    }
}

/// `PRAGMA wal_checkpoint(PASSIVE)`: (frames in the WAL, frames copied),
/// or `Err(())` when it could not run (another checkpoint holds the lock,
/// an error).
fn passive(conn: &Connection) -> Result<(u32, u32), ()> {
    let (busy, log, done) = conn
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?, row.get::<_, i64>(2)?))
        })
        .map_err(|_| ())?;
    if busy != 0 {
        return Err(());
    }
    Ok((u32::try_from(log).unwrap_or(0), u32::try_from(done).unwrap_or(0)))
}
