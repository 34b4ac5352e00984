//! Fair sharing of SQLite's write lock between processes.
//!
//! SQLite's lock is no queue: a process that waits polls for it, and a
//! process whose tasks write back to back hands it from one local writer to
//! the next without ever letting it go for long. Only the OS scheduler's
//! preemption then lets other processes in, so under a sustained burst of
//! one node the heartbeats of the others could wait far too long.
//!
//! So a writer that finds the lock taken by another process leaves a
//! signal in a small side file, `<dir>/couch_workers.wait`: its store's
//! random id and the time (the shared monotonic clock). A process about to
//! take the lock looks at the signal (one 16-byte `pread`); if another store
//! has waited within the last few milliseconds and this one has not stepped
//! aside for [`QUANTUM`], it sleeps [`STEP_ASIDE`] first, which the waiter,
//! polling every millisecond or so, uses to take the lock. The effect is
//! time slices of at least [`QUANTUM`] under contention, and nothing at all
//! without it. The signal is a hint: a torn or stale one costs at most one
//! short sleep, and a dead waiter's signal expires after [`FRESH_US`].
//!
//! Under contention the lock changes hands more often and the longest wait
//! for a write shortens, at some cost in total throughput (the waiter needs
//! up to a timer tick to notice the free lock); without contention it costs
//! one 16-byte read per write transaction. Figures (`tests/embedded_multiprocess.rs`):
//! bench/RESULTS.md, "Figures the module docs rely on".

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tokio::sync::OwnedMutexGuard;

use super::clock::monotonic_us;
use super::schema;
use super::Shared;
use crate::store::StoreError;

/// The longest sleep between two attempts to take SQLite's write lock from
/// another process: short, so that this process notices the lock free
/// while the holder steps aside; the holder's transactions last tens of
/// microseconds.
const MAX_LOCK_BACKOFF: Duration = Duration::from_millis(1);

/// The side file, next to the database.
pub(crate) const WAIT_FILE: &str = "couch_workers.wait";

/// A signal older than this (µs) is ignored: its waiter is gone or served.
const FRESH_US: u64 = 3_000;
/// A process steps aside at most once per quantum.
pub(crate) const QUANTUM: Duration = Duration::from_millis(5);
/// How long it steps aside.
const STEP_ASIDE: Duration = Duration::from_millis(2);
/// The signal is read at most this often (µs): a waiter's signal stays
/// fresh for [`FRESH_US`], so it is still seen; a writer that commits
/// back to back saves a `pread` per transaction.
const LOOK_EVERY_US: u64 = 500;

pub(crate) struct WaitSignal {
    /// `None` when the file cannot be opened: no fairness, nothing else lost.
    file: Option<File>,
    /// This store's id (two stores of one process are two contenders).
    id: u64,
    last_step_aside: AtomicU64,
    last_look: AtomicU64,
}

impl WaitSignal {
    pub(crate) fn open(dir: &Path) -> Self {
        let file =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(dir.join(WAIT_FILE)).ok();
        let id = loop {
            let id = rand::random::<u64>();
            if id != 0 {
                break id;
            }
        };
        WaitSignal { file, id, last_step_aside: AtomicU64::new(0), last_look: AtomicU64::new(0) }
    }

    /// A writer of this store found the lock taken by another process.
    pub(crate) fn signal_waiting(&self) {
        self.signal_waiting_at(monotonic_us());
    }

    /// [`Self::signal_waiting`] at the clock reading `now` (µs).
    fn signal_waiting_at(&self, now: u64) {
        if let Some(file) = &self.file {
            let mut buf = [0u8; 16];
            buf[..8].copy_from_slice(&self.id.to_le_bytes());
            buf[8..].copy_from_slice(&now.to_le_bytes());
            let _ = file.write_at(&buf, 0);
        }
    }

    /// Whether to step aside before taking the lock: another store waited
    /// recently and this one has not stepped aside within a quantum.
    pub(crate) fn should_step_aside(&self) -> bool {
        self.should_step_aside_at(monotonic_us())
    }

    /// [`Self::should_step_aside`] at the clock reading `now` (µs).
    fn should_step_aside_at(&self, now: u64) -> bool {
        let Some(file) = &self.file else { return false };
        if now.saturating_sub(self.last_look.load(Ordering::Relaxed)) < LOOK_EVERY_US {
            return false;
        }
        self.last_look.store(now, Ordering::Relaxed);
        let mut buf = [0u8; 16];
        if file.read_exact_at(&mut buf, 0).is_err() {
            return false;
        }
        let mut id = [0u8; 8];
        let mut at = [0u8; 8];
        id.copy_from_slice(&buf[..8]);
        at.copy_from_slice(&buf[8..]);
        let (id, at) = (u64::from_le_bytes(id), u64::from_le_bytes(at));
        if id == 0 || id == self.id || now.saturating_sub(at) > FRESH_US {
            return false;
        }
        let last = self.last_step_aside.load(Ordering::Relaxed);
        if now.saturating_sub(last) < QUANTUM.as_micros() as u64 {
            return false;
        }
        self.last_step_aside.store(now, Ordering::Relaxed);
        true
    }
}

/// Opens the write transaction on the write connection (`guard`: its
/// writer lock, held across the sleeps and given back) with `BEGIN
/// IMMEDIATE`: steps aside first if another process waits, then retries
/// while another process writes, signalling that this one waits, until
/// `timeout` from `started` ([`StoreError::Busy`]).
pub(crate) async fn begin_immediate(
    shared: &Shared,
    guard: OwnedMutexGuard<Connection>,
    started: Instant,
    timeout: Duration,
) -> Result<OwnedMutexGuard<Connection>, StoreError> {
    if shared.fair.should_step_aside() {
        // Another process has been waiting for the lock: let it in.
        tokio::time::sleep(STEP_ASIDE).await;
    }
    let mut attempt = 0u32;
    loop {
        if shared.is_closed() {
            return Err(StoreError::Closed);
        }
        match schema::exec_cached(&guard, "BEGIN IMMEDIATE") {
            Ok(()) => return Ok(guard),
            Err(e) if schema::is_busy(&e) => {
                // Another process writes. Keep this process's writer
                // lock meanwhile: the other local writers stay queued
                // in order instead of all polling SQLite.
                shared.fair.signal_waiting();
                attempt += 1;
                if started.elapsed() >= timeout {
                    return Err(StoreError::Busy);
                }
                tokio::time::sleep(lock_backoff(attempt)).await;
            }
            Err(e) => return Err(schema::store_error("cannot begin a write transaction", &e)),
        }
    }
}

/// Jittered sleep before the next attempt to take SQLite's write lock.
fn lock_backoff(attempt: u32) -> Duration {
    use rand::Rng;
    let ceiling = (250u64 << attempt.min(2)).min(MAX_LOCK_BACKOFF.as_micros() as u64);
    Duration::from_micros(rand::rng().random_range(ceiling / 2..=ceiling))
}

#[cfg(test)]
mod tests {
    use super::*;

    // The tests give every call its clock reading, so that no preemption of
    // a loaded machine moves a signal past its freshness or a look past
    // its throttle.

    /// Past the read throttle: the next look reads the file.
    const LATER: u64 = LOOK_EVERY_US + 100;

    #[test]
    fn steps_aside_for_others_once_per_quantum() {
        let dir = tempfile::tempdir().expect("temp dir");
        let a = WaitSignal::open(dir.path());
        let b = WaitSignal::open(dir.path());
        let quantum = QUANTUM.as_micros() as u64;
        let mut t = 1_000_000;
        assert!(!a.should_step_aside_at(t), "no signal yet");
        a.signal_waiting_at(t);
        t += LATER;
        assert!(!a.should_step_aside_at(t), "its own signal");
        assert!(b.should_step_aside_at(t), "another store waits");
        b.signal_waiting_at(t);
        a.signal_waiting_at(t);
        t += LATER;
        assert!(!b.should_step_aside_at(t), "within the quantum");
        t += quantum;
        a.signal_waiting_at(t);
        assert!(b.should_step_aside_at(t), "next quantum");
        t += FRESH_US + 1_000 + quantum;
        assert!(!b.should_step_aside_at(t), "a stale signal");
    }

    #[test]
    fn reads_the_signal_at_most_once_per_look_period() {
        let dir = tempfile::tempdir().expect("temp dir");
        let a = WaitSignal::open(dir.path());
        let b = WaitSignal::open(dir.path());
        let t = 1_000_000;
        let first = b.should_step_aside_at(t);
        a.signal_waiting_at(t + 1);
        let second = b.should_step_aside_at(t + 10);
        assert!(!first && !second, "the signal came after the first look: not read again within the period");
        assert!(b.should_step_aside_at(t + LATER), "read again after the period");
    }

    #[test]
    fn the_clock_based_calls_read_the_monotonic_clock() {
        let dir = tempfile::tempdir().expect("temp dir");
        let a = WaitSignal::open(dir.path());
        let b = WaitSignal::open(dir.path());
        let started = std::time::Instant::now();
        a.signal_waiting();
        // A fresh signal of another store, at the first look: step aside
        // (unless this machine stalled for longer than its freshness).
        let stepped = b.should_step_aside();
        if started.elapsed() < Duration::from_micros(FRESH_US / 2) {
            assert!(stepped, "a fresh signal read through the real clock");
        }
    }
}
