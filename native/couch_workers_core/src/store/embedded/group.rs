//! Group commit: the write transactions of one process that queue for the
//! writer lock share one SQLite commit.
//!
//! Writers of a process run one at a time on the store's write connection
//! (`transaction/`). Without grouping each pays a whole SQLite commit
//! (WAL frames for the pages it touched, the WAL-index update, the lock
//! hand-over), so concurrent callers are bounded by the commit rate: J2's
//! eight `job_finish` calls queued behind each other, each paying ~35 µs.
//! Measured on the core, `add_many` of k jobs in one transaction: 14.7k
//! jobs/s at k = 1, 55.7k at 8, 88.6k at 32.
//!
//! So a writer that finishes while others are queued does not commit: its
//! work stays in the open SQLite transaction (each writer runs inside a
//! `SAVEPOINT` after the first, so a failing one rolls back only its own
//! work), it becomes a *member* of the batch, lets the next writer in, and
//! waits for the batch's outcome. The writer that finds nobody queued (or
//! the batch full) commits for all and tells every member. A member also
//! queues for the lock again: if it gets the lock and the batch is still
//! open (the writers after it failed, gave up or were dropped), it commits
//! the batch itself, so a batch never stays open for want of a committer.
//! Whoever commits the batch also tells the watch hub of every member's
//! writes (`OnCommit`): a member whose future is dropped while it waits
//! never would.
//!
//! As in FoundationDB, which batches the commits of many transactions the
//! same way, every member keeps its own commit version (they increase
//! within the batch) and nothing a member wrote is visible to other
//! connections, or reported as committed, before the batch commits. If the
//! batch's commit fails, every member fails with that error (retryable or
//! not, as for a single commit). A lone writer (J1: one awaited call at a
//! time) never waits: nobody is queued, so it commits at once.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::{oneshot, OwnedMutexGuard};

use super::schema;
use super::Shared;
use crate::store::StoreError;

/// The most members of one batch: bounds what one failed commit takes with
/// it and how long the first member waits.
const MAX_MEMBERS: usize = 32;

/// The most [`commit_grace`] gives: a call waits for its budget plus the
/// grace at worst, and the Erlang side gives up on a call after its budget
/// plus 5 s (`couch_workers_app:call_timeout/0`), so the answer must come
/// well before that or nobody hears it.
const MAX_COMMIT_GRACE: Duration = Duration::from_secs(2);

/// How long a member whose call's budget ended while it waits for its
/// batch keeps waiting for the outcome (`Database::commit_grace`). A batch
/// stays open only while a writer of this process holds the writer lock
/// (another process's write lock blocks a `BEGIN`, never a batch already
/// open, which holds SQLite's lock), and the member, queued for that lock
/// since it joined (`wait`), commits the batch itself once it gets it. The
/// writers ahead of it queued before it joined, so they started less than
/// one budget before its deadline; with the node's one budget
/// (`tx_timeout_ms`) each ends (commits, fails or is dropped by its own
/// retry loop, letting the lock go) within one budget after the member's
/// deadline. So one budget is enough for writers under the retry loop,
/// capped at [`MAX_COMMIT_GRACE`]; a writer holding the lock outside any
/// budget can outlast it, and then the answer is still `CommitUnknown`.
pub(crate) fn commit_grace(budget: Duration) -> Duration {
    budget.min(MAX_COMMIT_GRACE)
}

/// The outcome of a batch, as its members receive it.
pub(crate) type Outcome = oneshot::Receiver<Result<(), StoreError>>;

/// What a member leaves to run once its batch has committed: it tells the
/// watch hub of the member's writes (`transaction/commit.rs`).
pub(crate) type OnCommit = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Batch {
    /// Counts the batches that ended: a member knows its batch by it.
    seq: u64,
    members: Vec<oneshot::Sender<Result<(), StoreError>>>,
    /// Run by whoever commits the batch, once it committed, before the
    /// members hear of it: a member may have stopped waiting (its future
    /// dropped: the retry loop's timeout) and would then never tell the
    /// watch hub of writes the batch committed for it.
    on_commit: Vec<OnCommit>,
    /// `meta.last_version` as the open SQLite transaction of the write
    /// connection has it, raised by every commit version fixed in it:
    /// SQLite's write lock is held throughout, so no other connection can
    /// change it, and the writers of a batch read and write it here
    /// instead of two `meta` statements each. `None`: not known (no
    /// transaction open, or it ended).
    last_version: Option<u64>,
    /// `last_version` is above what `meta` holds: [`commit_batch`] writes
    /// it before the `COMMIT`.
    version_unsaved: bool,
}

#[derive(Default)]
pub(crate) struct GroupCommit {
    /// Writers waiting for the writer lock with a transaction to run
    /// (members queued again to commit a stranded batch are not counted).
    queued: AtomicUsize,
    /// The last batch had members: this process's writers come together
    /// (J2's workers), not one at a time (J1's single caller).
    grouping: AtomicBool,
    /// Only changed by the holder of the writer lock.
    batch: Mutex<Batch>,
}

/// Counts one queued writer while it waits for the lock.
pub(crate) struct Queued<'a>(&'a GroupCommit);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

impl GroupCommit {
    fn lock(&self) -> MutexGuard<'_, Batch> {
        self.batch.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Call before waiting for the writer lock; drop once it is held (or
    /// the wait is given up).
    pub(crate) fn queue(&self) -> Queued<'_> {
        self.queued.fetch_add(1, Ordering::AcqRel);
        Queued(self)
    }

    /// Writers now waiting for the writer lock (tests: a schedule waits
    /// for a writer to be queued instead of sleeping and hoping).
    #[cfg(feature = "testkit")]
    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// Whether a writer that just finished should leave its commit to a
    /// writer queued behind it. Called with the writer lock held.
    pub(crate) fn should_defer(&self) -> bool {
        self.queued.load(Ordering::Acquire) > 0 && self.lock().members.len() < MAX_MEMBERS
    }

    /// Whether a writer about to commit alone should first let the tasks
    /// that are ready run (`transaction/commit.rs`): only while writers come
    /// together (the last batch had members), or while other tasks wait to
    /// be polled (`tasks_waiting`: they may be writers, and would otherwise
    /// only reach the lock after this commit), so that a lone caller, whose
    /// next call cannot be queued while it waits for this one, never pays
    /// for it.
    pub(crate) fn worth_waiting(&self, tasks_waiting: bool) -> bool {
        self.queued.load(Ordering::Acquire) == 0 && (tasks_waiting || self.grouping.load(Ordering::Relaxed))
    }

    /// Joins the open batch: (the batch's number, its outcome);
    /// `on_commit` runs if it commits.
    pub(crate) fn join(&self, on_commit: Option<OnCommit>) -> (u64, Outcome) {
        let (tx, rx) = oneshot::channel();
        let mut batch = self.lock();
        batch.members.push(tx);
        batch.on_commit.extend(on_commit);
        (batch.seq, rx)
    }

    /// Whether writes of earlier members are in the open SQLite transaction.
    pub(crate) fn has_members(&self) -> bool {
        !self.lock().members.is_empty()
    }

    /// The batch ended (committed, or lost): runs its members' `on_commit`
    /// if it committed, then tells every member. Called with the writer
    /// lock held, before it is let go, so that a member that gets the lock
    /// next already has its outcome.
    pub(crate) fn finish(&self, result: &Result<(), StoreError>) {
        let (members, on_commit) = {
            let mut batch = self.lock();
            batch.seq += 1;
            (std::mem::take(&mut batch.members), std::mem::take(&mut batch.on_commit))
        };
        if result.is_ok() {
            // In the members' order, which is their writes' order.
            for f in on_commit {
                f();
            }
        }
        self.grouping.store(!members.is_empty(), Ordering::Relaxed);
        for member in members {
            let _ = member.send(result.clone());
        }
    }

    fn seq(&self) -> u64 {
        self.lock().seq
    }

    /// The open write transaction's last version, if known (see
    /// [`Batch::last_version`]). Called with the writer lock held.
    pub(crate) fn last_version(&self) -> Option<u64> {
        self.lock().last_version
    }

    /// The open write transaction read `last` from `meta` (its start).
    pub(crate) fn opened_at(&self, last: u64) {
        let mut batch = self.lock();
        batch.last_version = Some(last);
        batch.version_unsaved = false;
    }

    /// A commit version was fixed in the open write transaction: `meta`
    /// gets it at the batch's commit. Versions only rise: a writer that
    /// rolls back to its savepoint leaves its version unused, which is
    /// harmless (versions must increase, not be dense), and nothing after
    /// it may reuse it.
    pub(crate) fn fixed(&self, version: u64) {
        let mut batch = self.lock();
        batch.last_version = Some(batch.last_version.map_or(version, |v| v.max(version)));
        batch.version_unsaved = true;
    }

    /// The open write transaction ended (committed or rolled back).
    pub(crate) fn closed(&self) {
        let mut batch = self.lock();
        batch.last_version = None;
        batch.version_unsaved = false;
    }

    fn unsaved_version(&self) -> Option<u64> {
        let batch = self.lock();
        batch.last_version.filter(|_| batch.version_unsaved)
    }
}

/// The savepoint a writer that joins an open batch runs under: its failure
/// rolls back its own work only.
const SAVEPOINT: &str = "SAVEPOINT cw";
const ROLLBACK_TO_SAVEPOINT: &str = "ROLLBACK TO cw";
const RELEASE_SAVEPOINT: &str = "RELEASE cw";

impl GroupCommit {
    /// A writer found the write connection's SQLite transaction open (a
    /// batch): it joins it under a savepoint. Called with the writer lock
    /// held.
    pub(crate) fn join_open(&self, conn: &Connection) -> Result<(), StoreError> {
        schema::exec_cached(conn, SAVEPOINT).map_err(|e| schema::store_error("cannot begin a write transaction", &e))
    }

    /// A joined writer's work becomes the batch's: its savepoint goes. A
    /// failure from here on must not roll back to it.
    pub(crate) fn keep_joined(&self, conn: &Connection) -> Result<(), StoreError> {
        schema::exec_cached(conn, RELEASE_SAVEPOINT).map_err(|e| schema::store_error("cannot commit", &e))
    }

    /// Rolls back a writer that did not commit (or gave its work to the
    /// batch) before the writer lock is let go. A joined (`nested`) writer
    /// rolls back to its savepoint only: the batch it ran in keeps the
    /// work of the writers before it.
    pub(crate) fn release(&self, conn: &Connection, nested: bool) {
        if conn.is_autocommit() {
            // Nothing open (committed), or SQLite rolled back by
            // itself after an error: then a batch's members lost
            // their work too.
            if nested && self.has_members() {
                let _ = commit_batch(self, conn);
            }
            self.closed();
        } else if nested {
            let undone = schema::exec_cached(conn, ROLLBACK_TO_SAVEPOINT)
                .and_then(|()| schema::exec_cached(conn, RELEASE_SAVEPOINT));
            if undone.is_err() {
                // The savepoint cannot be trusted: give up the batch.
                let _ = schema::exec_cached(conn, "ROLLBACK");
                let _ = commit_batch(self, conn);
            }
        } else {
            let _ = schema::exec_cached(conn, "ROLLBACK");
            self.closed();
        }
    }
}

/// Commits the open SQLite transaction of the write connection and ends
/// the batch with the outcome; rolls back what a failed commit left open.
pub(crate) fn commit_batch(group: &GroupCommit, conn: &Connection) -> Result<(), StoreError> {
    let result = if conn.is_autocommit() {
        // SQLite rolled the transaction back by itself (an I/O error, a
        // full disk in a statement of a later writer): the members' work
        // is gone.
        Err(StoreError::Io("the group commit's transaction was rolled back by SQLite after an error".into()))
    } else {
        let saved = match group.unsaved_version() {
            Some(v) => {
                schema::set_last_version(conn, v).map_err(|e| schema::store_error("cannot store the last version", &e))
            }
            None => Ok(()),
        };
        saved.and_then(|()| schema::exec_cached(conn, "COMMIT").map_err(|e| schema::store_error("cannot commit", &e)))
    };
    if result.is_err() && !conn.is_autocommit() {
        let _ = schema::exec_cached(conn, "ROLLBACK");
    }
    group.closed();
    group.finish(&result);
    result
}

/// A member's wait for its batch's outcome.
pub(crate) async fn wait(shared: &Arc<Shared>, seq: u64, mut outcome: Outcome) -> Result<(), StoreError> {
    let mut stranded = Stranded { shared: shared.clone(), seq, resolved: false };
    let result = tokio::select! {
        biased;
        result = &mut outcome => received(result),
        guard = shared.writer.clone().lock_owned() => commit_if_open(shared, guard, outcome),
    };
    stranded.resolved = true;
    result
}

fn received(result: Result<Result<(), StoreError>, impl std::fmt::Debug>) -> Result<(), StoreError> {
    result.unwrap_or_else(|_| Err(StoreError::Io("the group commit ended without an outcome".into())))
}

/// Holding the writer lock: the outcome was sent before the lock was let
/// go, so no outcome means the batch is still open: commit it.
fn commit_if_open(shared: &Shared, guard: OwnedMutexGuard<Connection>, mut outcome: Outcome) -> Result<(), StoreError> {
    if let Ok(result) = outcome.try_recv() {
        return result;
    }
    // The outcome goes to every member, this one included.
    let _ = commit_batch(&shared.group, &guard);
    received(outcome.try_recv())
}

/// Commits the batch if a member stops waiting (its future dropped: a
/// timeout around the commit) and nobody else would: a batch left open
/// would hold SQLite's write lock for good.
struct Stranded {
    shared: Arc<Shared>,
    seq: u64,
    resolved: bool,
}

impl Drop for Stranded {
    fn drop(&mut self) {
        if self.resolved {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (shared, seq) = (self.shared.clone(), self.seq);
        runtime.spawn(async move {
            let guard = shared.writer.clone().lock_owned().await;
            if shared.group.seq() == seq && shared.group.has_members() {
                let _ = commit_batch(&shared.group, &guard);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_batch_with_members_or_waiting_tasks_make_a_lone_writer_wait() {
        let group = GroupCommit::default();
        assert!(!group.worth_waiting(false), "nothing grouped yet");
        // Tasks waiting to be polled may be writers: worth a yield.
        assert!(group.worth_waiting(true));
        // A lone commit (J1's single caller): still no reason to wait.
        group.finish(&Ok(()));
        assert!(!group.worth_waiting(false));
        // A batch that a writer joined: writers come together.
        let (_, mut outcome) = group.join(None);
        group.finish(&Ok(()));
        assert_eq!(outcome.try_recv(), Ok(Ok(())));
        assert!(group.worth_waiting(false));
        // Unless one is already queued (it will join anyway).
        let queued = group.queue();
        assert!(!group.worth_waiting(false));
        assert!(!group.worth_waiting(true));
        drop(queued);
        // The next lone commit turns it off again.
        group.finish(&Ok(()));
        assert!(!group.worth_waiting(false));
    }

    #[test]
    fn the_batch_version_only_rises_and_is_forgotten_when_it_ends() {
        let group = GroupCommit::default();
        assert_eq!(group.last_version(), None);
        group.opened_at(10);
        assert_eq!((group.last_version(), group.unsaved_version()), (Some(10), None));
        group.fixed(12);
        group.fixed(11);
        assert_eq!((group.last_version(), group.unsaved_version()), (Some(12), Some(12)));
        group.closed();
        assert_eq!((group.last_version(), group.unsaved_version()), (None, None));
    }
}
