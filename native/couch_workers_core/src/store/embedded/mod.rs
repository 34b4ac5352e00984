//! The embedded store: SQLite in WAL mode on local disk, with
//! FoundationDB's transaction model (see [`crate::store`]).
//!
//! One file, `<dir>/couch_workers.sqlite` (with SQLite's `-wal` and `-shm`
//! beside it, `couch_workers.wait`, a 16-byte hint for fair locking, and
//! `wake/`, one socket per open handle for post-commit wake-ups).
//! Every OS process on the host (each Erlang node) that opens the same
//! directory shares one serializable database: SQLite serializes writers across processes with
//! its file locks, WAL readers never block, and versions come from one
//! clock shared by every process of a boot ([`clock`]).
//!
//! | module | job |
//! | --- | --- |
//! | `mod.rs` | [`EmbeddedOptions`], [`EmbeddedStore`]: opening, closing, [`Database`] |
//! | `schema.rs` | the file's tables, connection settings, setup (waiting for other processes' setup), SQLite error mapping |
//! | `holders.rs` | which processes hold locks on the store's file (for the error of an open that waited too long) |
//! | `clock.rs` | the version clock (`base + CLOCK_MONOTONIC`) |
//! | `fair.rs` | taking SQLite's write lock (`BEGIN IMMEDIATE`, retries) and sharing it fairly between processes |
//! | `group.rs` | group commit of this process's queued writers; a joining writer's savepoint |
//! | `transaction/` | [`Transaction`](crate::store::Transaction): read and write modes (`mod.rs`), writes (`write.rs`), commit (`commit.rs`), versions (`version.rs`) |
//! | `watch.rs` | the watch registry |
//! | `watcher.rs` | the `cw-embed-watch` thread: when it reads the watched keys |
//! | `listener.rs` | what that thread sleeps on: its bell (`bell.rs`) and its notification sources (`sources.rs`: wake-ups from other handles or, as a fallback, inotify on the WAL), in one `ppoll` |
//! | `relisten.rs` | when and how that thread listens again after its notification sources failed |
//! | `wake.rs` | post-commit wake-ups: this handle's socket in `wake/`, and the sends to the other handles' |
//! | `checkpoint.rs` | WAL checkpoints: the `cw-embed-ckpt` thread |
//! | `pool.rs` | pooled read connections |
//! | `sql_trace.rs` | the write connection's statements to a file, for the bench's bare-SQLite replay (feature `sql-trace`) |
//!
//! Durability: `synchronous=NORMAL` (the default) makes every commit a
//! write into the WAL without fsync. It survives the crash or `kill -9` of
//! any process (the data is in the OS page cache); a power failure or OS
//! crash may lose the last commits, never corrupt the file. `Full` fsyncs
//! every commit.
//!
//! WAL checkpoints: never inside a commit. The `cw-embed-ckpt` thread runs
//! them in the background and briefly holds back this process's writers
//! only so that the WAL can start over (`checkpoint.rs`). SQLite's automatic
//! checkpoint, which ran inside the commit that crossed 1,000 pages, made
//! a commit now and then take milliseconds (its fsyncs).
//!
//! Figures (commit rates by durability and concurrency, watch latency, the
//! idle cost of watches): `bench/RESULTS.md`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::Connection;

use super::{Database, StoreError, Tx, TxOptions};

mod adds;
mod bell;
mod checkpoint;
mod clock;
mod fair;
mod group;
mod holders;
mod listener;
// Also the sim store's versionstamp and ADD formats.
mod pool;
#[cfg(target_os = "linux")]
mod relisten;
mod schema;
mod sources;
mod sql_trace;
mod transaction;
mod unreadable;
mod wake;
mod watch;
mod watcher;

use checkpoint::CheckpointSignal;
use clock::Clock;
use fair::WaitSignal;
use group::GroupCommit;
use pool::ReadPool;
use transaction::EmbeddedTransaction;
use wake::{Peers, WakeSocket};
use watch::WatchHub;

pub use schema::FILE_NAME;
// What the inspection methods below answer (for tests and the bench).
#[cfg(any(test, feature = "internals"))]
pub use wake::WakeStats;
#[cfg(any(test, feature = "internals"))]
pub use watch::{WakeCause, WatchTrace};
pub use watcher::SAFETY_LOOK;

/// SQLite's `synchronous` setting for every connection of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// No fsync per commit: survives a process crash; the last commits may
    /// be lost on power failure.
    #[default]
    Normal,
    /// fsync per commit: also survives a power failure; slower commits.
    Full,
}

/// How to open an embedded store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddedOptions {
    /// The store's directory (created if missing); the file is
    /// `dir/couch_workers.sqlite`.
    pub dir: PathBuf,
    /// Durability of commits (default [`Synchronous::Normal`]).
    pub synchronous: Synchronous,
    /// Wake the watcher thread when another handle of the store (another
    /// process's, or this one's) commits, instead of polling (Linux;
    /// default `true`): through this handle's wake socket (see
    /// `wake_socket`), else through inotify on the WAL. A quiet store then
    /// costs no CPU. Where neither can start, the store polls as with
    /// `false`. Every handle sends its post-commit wake-ups either way.
    pub wal_notify: bool,
    /// With `wal_notify`: bind a wake socket in `dir/wake/` so that other
    /// handles' commits wake this one once they are visible (default
    /// `true`). `false`, or when the socket cannot be bound (a read-only
    /// or full directory: logged as `wake_socket_unavailable`), inotify on
    /// the WAL wakes it instead, with a settle window after each write.
    pub wake_socket: bool,
    /// Without WAL notifications: how often the watcher thread polls for
    /// commits of other processes while watches are pending and commits
    /// were seen within the last 250 ms (default 1 ms). Commits through
    /// this store wake it at once.
    pub watch_poll: Duration,
    /// Without WAL notifications, the poll interval once nothing has
    /// changed for 250 ms (default 4 ms): the first change after a quiet
    /// spell is seen within this, the following ones within `watch_poll`.
    pub watch_poll_idle: Duration,
    /// With `wal_notify` running: the longest the watcher thread sleeps
    /// between two looks at `data_version` (default
    /// [`SAFETY_LOOK`], 10 s). Every handle of this code wakes the
    /// others when it commits; this bounds how late a commit by a writer
    /// that sends no wake-up (the `sqlite3` shell, an older build, a
    /// process killed between its commit and its wake-up) fires a watch.
    /// Each look is a wake-up of an otherwise idle thread.
    pub safety_look: Duration,
    /// Idle read connections kept for read-mode transactions (default 4).
    pub read_pool: usize,
    /// A transaction older than this fails with `TooOld` (default 5 s,
    /// FoundationDB's limit; lower it only in tests).
    pub max_transaction_age: Duration,
}

impl EmbeddedOptions {
    /// The defaults, for a store in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        EmbeddedOptions {
            dir: dir.into(),
            synchronous: Synchronous::Normal,
            wal_notify: true,
            wake_socket: true,
            watch_poll: Duration::from_millis(1),
            watch_poll_idle: Duration::from_millis(4),
            safety_look: watcher::SAFETY_LOOK,
            read_pool: 4,
            max_transaction_age: Duration::from_secs(5),
        }
    }
}

/// What the store's transactions share.
pub(crate) struct Shared {
    pub(crate) clock: Clock,
    pub(crate) max_age: Duration,
    /// The write connection behind the in-process writer lock.
    pub(crate) writer: Arc<tokio::sync::Mutex<Connection>>,
    pub(crate) readers: ReadPool,
    pub(crate) watches: Arc<WatchHub>,
    pub(crate) fair: WaitSignal,
    pub(crate) group: GroupCommit,
    /// The other handles' sockets: the write connection's WAL hook wakes
    /// them after its commits, a read-mode transaction's commit after its
    /// own (`transaction/commit.rs`).
    pub(crate) peers: Arc<Peers>,
    checkpoints: Arc<CheckpointSignal>,
    closed: AtomicBool,
}

impl Shared {
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// An open embedded store. Dropping the last handle closes it.
pub struct EmbeddedStore {
    shared: Arc<Shared>,
    opts: EmbeddedOptions,
    path: PathBuf,
    /// The watcher and checkpoint threads, joined by `close`.
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore").field("path", &self.path).field("opts", &self.opts).finish()
    }
}

impl EmbeddedStore {
    /// Opens (creating if needed) the store in `opts.dir` and starts its
    /// watcher thread. Blocks briefly (file setup); other processes may
    /// open the same directory at the same time.
    pub fn open(opts: EmbeddedOptions) -> Result<Arc<EmbeddedStore>, StoreError> {
        let (mut writer, clock) = schema::open_store_file(&opts)?;
        sql_trace::install(&mut writer);
        let path = opts.dir.join(FILE_NAME);
        let watch_conn = schema::open_connection(&path, &opts)?;
        let checkpoint_conn = schema::open_connection(&path, &opts)?;
        let checkpoints = Arc::new(CheckpointSignal::default());
        let wake = if opts.wal_notify && opts.wake_socket { bind_wake_socket(&opts.dir) } else { None };
        let peers = Arc::new(Peers::new(&opts.dir, wake.as_ref().and_then(|w| w.file_name())));
        let sender = peers.clone();
        checkpoint::install_hook(&mut writer, checkpoints.clone(), move || sender.wake_all())
            .map_err(|e| schema::io_error("cannot install the WAL hook", &e))?;
        let writer = Arc::new(tokio::sync::Mutex::new(writer));
        let hub =
            Arc::new(WatchHub::new().map_err(|e| StoreError::Io(format!("cannot create the watcher's eventfd: {e}")))?);
        let polling =
            watcher::Polling { active: opts.watch_poll, idle: opts.watch_poll_idle, safety: opts.safety_look };
        // The socket is the watcher's alone: its file goes when the watcher
        // thread ends (`close` joins it), as soon as its notifications fail
        // (a new one is bound when it listens again), and at once if
        // nothing reads it (others then stop sending to it).
        let sources = opts.wal_notify.then(|| sources::Sources {
            wake,
            peers: peers.clone(),
            wal_name: format!("{FILE_NAME}-wal"),
        });
        let listener = listener::Listener::new(&opts.dir, sources, opts.wake_socket, hub.bell());
        let watcher = watcher::spawn_watcher(hub.clone(), watch_conn, polling, listener)
            .map_err(|e| StoreError::Io(format!("cannot start the watcher thread: {e}")))?;
        let checkpointer = match checkpoint::spawn_checkpointer(checkpoints.clone(), checkpoint_conn, writer.clone()) {
            Ok(handle) => handle,
            Err(e) => {
                hub.close();
                let _ = watcher.join();
                return Err(StoreError::Io(format!("cannot start the checkpoint thread: {e}")));
            }
        };
        let threads = vec![watcher, checkpointer];
        let shared = Arc::new(Shared {
            clock,
            max_age: opts.max_transaction_age,
            writer,
            readers: ReadPool::new(path.clone(), opts.clone()),
            watches: hub,
            fair: WaitSignal::open(&opts.dir),
            group: GroupCommit::default(),
            peers,
            checkpoints,
            closed: AtomicBool::new(false),
        });
        Ok(Arc::new(EmbeddedStore { shared, opts, path, threads: Mutex::new(threads) }))
    }
}

/// Inspection and test hooks: for the crate's tests and the bench
/// (feature `internals`), never called by a node.
#[cfg(any(test, feature = "internals"))]
impl EmbeddedStore {
    /// This handle's post-commit wake-ups: sent, received, peers known.
    pub fn wake_stats(&self) -> WakeStats {
        self.shared.peers.stats()
    }

    /// The WAL's length after the last commit of this store, in frames
    /// (pages): what the checkpoint thread keeps bounded.
    pub fn wal_frames(&self) -> u32 {
        self.shared.checkpoints.wal_frames()
    }

    /// SQLite commits of this store's write connection so far: with group
    /// commit, fewer than its write transactions when writers queue.
    pub fn sqlite_commits(&self) -> u64 {
        self.shared.checkpoints.commits()
    }

    /// The SQLite file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Watches registered and not yet fired, failed or dropped-and-swept.
    pub fn pending_watches(&self) -> usize {
        self.shared.watches.pending()
    }

    /// Looks of the watcher thread whose read failed (the store was busy:
    /// a WAL recovery by another process; or an I/O error).
    pub fn watch_read_failures(&self) -> u64 {
        self.shared.watches.failed_reads()
    }

    /// Tests only: the watcher thread's notification sources (this
    /// handle's wake socket, inotify) fail at its next wait, as when a
    /// `recv` or an inotify read fails; it polls until it listens again
    /// (`listener.rs`). Returns at
    /// once: see [`EmbeddedStore::watch_sources_failure_pending`].
    #[cfg(feature = "testkit")]
    pub fn fail_watch_sources(&self) {
        self.shared.watches.fail_sources();
    }

    /// Tests only: [`EmbeddedStore::fail_watch_sources`] was called and the
    /// watcher thread has not yet taken the failure.
    #[cfg(feature = "testkit")]
    pub fn watch_sources_failure_pending(&self) -> bool {
        self.shared.watches.sources_failure_pending()
    }

    /// The stages of the watcher thread's last wake-up that fired a watch
    /// (`None` before the first), for the bench's breakdown.
    pub fn watch_trace(&self) -> Option<WatchTrace> {
        self.shared.watches.trace()
    }

    /// The store's clock now: what a transaction's read version would be
    /// with no newer commit.
    pub fn clock_now(&self) -> u64 {
        self.shared.clock.now()
    }

    /// Tests only: how many of this handle's writers wait for its writer
    /// lock with a transaction to run (the group commit's count), so that
    /// a schedule can wait until a writer is queued.
    #[cfg(feature = "testkit")]
    pub fn writers_queued(&self) -> usize {
        self.shared.group.queued()
    }

    /// Fault tests only: moves this handle's version clock forward by
    /// `by`, as every FoundationDB recovery moves versions by 100 s' worth
    /// (`MAX_VERSIONS_IN_FLIGHT`). Versions then rise at their usual rate.
    /// Only this handle's clock moves (other handles and processes keep
    /// the base they read at open): use it where one handle serves the
    /// test's nodes.
    #[doc(hidden)]
    pub fn jump_versions(&self, by: Duration) {
        self.shared.clock.jump(u64::try_from(by.as_micros()).unwrap_or(u64::MAX));
    }
}

#[async_trait]
impl Database for EmbeddedStore {
    async fn create_transaction(&self, opts: &TxOptions) -> Result<Tx, StoreError> {
        let tx = EmbeddedTransaction::begin(self.shared.clone(), opts).await?;
        Ok(Arc::new(tx))
    }

    fn prefix(&self) -> Vec<u8> {
        Vec::new()
    }

    fn kind(&self) -> &'static str {
        "embedded"
    }

    fn versions_follow_time(&self) -> bool {
        true
    }

    /// Every commit it answers has its outcome: done, or failed and
    /// rolled back (a group-commit member gets its batch's outcome).
    fn commits_may_be_unknown(&self) -> bool {
        false
    }

    /// A spared write updates what this handle's watches expect instead
    /// of firing them (`watch.rs`).
    fn spares_own_watches(&self) -> bool {
        true
    }

    /// A commit cut off by the budget may be waiting for a group commit
    /// that will decide it: wait for that (`group::commit_grace`).
    fn commit_grace(&self, budget: Duration) -> Duration {
        group::commit_grace(budget)
    }

    fn backoff_policy(&self) -> crate::store::backoff::BackoffPolicy {
        crate::store::backoff::BackoffPolicy::LOCAL
    }

    fn durability(&self) -> String {
        match self.opts.synchronous {
            Synchronous::Normal => "sqlite WAL, synchronous=NORMAL (survives a process crash; \
                                    the last commits may be lost on power failure)"
                .into(),
            Synchronous::Full => "sqlite WAL, synchronous=FULL (survives a process crash and power failure)".into(),
        }
    }

    fn close(&self) {
        if self.shared.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.shared.watches.close();
        self.shared.checkpoints.close();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
        for handle in threads {
            let _ = handle.join();
        }
        self.shared.readers.clear();
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        self.close();
    }
}

/// Binds this handle's wake socket; `None` (logged) where the directory
/// refuses it: the store then works without it (`sources.rs`'s fallback).
fn bind_wake_socket(dir: &Path) -> Option<Arc<WakeSocket>> {
    match WakeSocket::bind(dir) {
        Ok(socket) => Some(Arc::new(socket)),
        Err(e) => {
            crate::log_event!(
                crate::log::Logger::PROCESS,
                Warning,
                "wake_socket_unavailable",
                dir = %dir.display(),
                reason = %e
            );
            None
        }
    }
}
