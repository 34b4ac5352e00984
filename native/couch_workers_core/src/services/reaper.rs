//! The reaper: every node runs one; it removes workers whose heartbeats
//! stopped, by the liveness rule of `liveness.rs` (dead only after this
//! reaper itself saw the record unchanged for the timeout, in store
//! versions and on its own monotonic clock, while the store was writable).
//!
//! A pass: first a write transaction that adds 1 to the `reaper_pulse`
//! counter (it shows the store takes writes now: on the embedded store it
//! takes SQLite's write lock, which another process may hold, and needs no
//! write to do so, so the add is left out there; on FoundationDB only a
//! transaction that writes commits at all). Its commit
//! also keeps the store's versions moving with time: FoundationDB's read
//! versions move only with commits (and an idle commit proxy's empty
//! batch every `MAX_COMMIT_BATCH_INTERVAL`, 2 s), so once a dead node's
//! heartbeats stop, the reapers' own commits are what the version measure
//! counts. The pass's scan reads at or after that commit's version, which
//! the master made the previous batch's plus all the time since it: the
//! version a record is first seen at, and the one it is judged at, follow
//! the master's clock, not the lag of a quiet cluster's read versions. The
//! step from the pass's first read version to its scan's (up to the time
//! since the previous batch) is one batch's catching up, which the
//! observer allows for (`JUMP_SLACK_VERSIONS`). Then the health records of every
//! worker type in read transactions of at most [`SCAN_BATCH`] keys
//! (skipping from type to type, so member options are never read; a store
//! of a few workers takes one), each judged by the [`Observer`]; then
//! each dead worker is reaped in its own transaction that removes it only
//! if its record is still the one observed. Every transaction is a
//! [`Look`] for the observer, and each is cut off at the observer's stall
//! bound: a transaction that fails or takes longer starts observation
//! again. Reapers on several nodes may race: the re-check under
//! serializable transactions means a worker is removed once, and never
//! after a heartbeat renewed it.
//!
//! Between passes it sleeps until the first of: the earliest moment a
//! worker could be dead (so a dead worker goes within milliseconds of its
//! timeout); the stall bound, jittered down (the cadence the liveness rule
//! needs to see a stall; no timer at all while it observes no worker); a
//! change of `health_vs`, which every transaction that writes a health
//! record bumps (a watch armed in the first transaction of the pass after
//! the previous one fired, and kept over passes on the timer), so that a
//! fresh heartbeat is seen soon after it is written (its observation
//! starts only then) without looking on a timer. After a change it looks
//! no sooner than `max_interval` after the previous pass began, so a busy
//! store costs no more passes than that; if the watch fails it looks every
//! `max_interval`. An idle node thus passes about twice per heartbeat
//! period of its workers, not several times a second.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::heartbeat::Heartbeats;
use crate::context::Context;
use crate::keyspace::WorkerKey;
use crate::liveness::{Look, Observer, Restart, Verdict, WorkerId};
use crate::log::TARGET;
use crate::log_event;
use crate::store::receipt::{self, RetrySafe};
use crate::store::{run_attempts, Attempt, RangeRequest, StoreError, Tx, TxOptions, Watch};
use crate::roster;
use crate::tasks::jittered;

/// Health records read per scan transaction.
const SCAN_BATCH: usize = 1000;

/// The jitter of the sleep between passes (a share of it).
const JITTER: f64 = 0.2;

/// How far past the earliest possible death the reaper wakes, so that
/// both measures have surely passed it.
const WAKE_MARGIN: Duration = Duration::from_millis(20);

#[derive(Clone)]
pub(crate) struct Reaper {
    pub ctx: Arc<Context>,
    pub cancel: CancellationToken,
    pub max_interval: Duration,
    /// This node's heartbeats: `transactions()` counts their renewals.
    pub own: Arc<Heartbeats>,
}

/// A worker the observer found dead, with the record it observed.
struct Suspect {
    worker: WorkerId,
    record: Vec<u8>,
}

/// What a scan found.
#[derive(Default)]
struct Scan {
    suspects: Vec<Suspect>,
    /// The least time until a live worker could be dead.
    next_death: Option<Duration>,
}

impl Reaper {
    /// The reaper's loop; supervised (`supervise.rs`): a restart starts
    /// observing again, which never reaps a live worker (`liveness.rs`).
    pub(crate) async fn run(self) {
        // A new observer: a reaper that (re)starts has seen nothing. It
        // plans no sleep longer than the stall bound while it observes.
        let mut observer = Observer::new(Duration::MAX);
        // The `health_vs` watch, kept from pass to pass until it fires: a
        // watch armed at an earlier pass sees every change since then, so
        // a pass on the timer arms none (each new watch costs the store a
        // registration and its watcher a read).
        let mut changed: Option<Watch> = None;
        // This node's renewals begun when the watch was armed: one begun
        // since may be what fired it.
        let mut armed_at_commits = self.own.transactions();
        loop {
            let began = Instant::now();
            let commits = self.own.transactions();
            let was_armed = changed.is_some();
            let next_death = match self.pass(&mut observer, &mut changed).await {
                Ok(next) => next,
                Err(e) => {
                    if self.cancel.is_cancelled() {
                        return;
                    }
                    // A failed transaction of its own: what it saw may
                    // span a stretch where the store took no writes.
                    observer.restart();
                    log_event!(self.ctx.log, Warning, "reaper_scan_failed", reason = %e);
                    None
                }
            };
            // The timer: the next possible death, and the liveness rule's
            // cadence while anything is observed.
            let cadence =
                (observer.watching() > 0).then(|| observer.stall_bound().mul_f64(1.0 - JITTER * rand::random::<f64>()));
            let timer = match (next_death.map(|d| d + WAKE_MARGIN), cadence) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if !was_armed && changed.is_some() {
                armed_at_commits = commits;
            }
            if !self.wait(began, timer, &mut changed, armed_at_commits).await {
                return;
            }
        }
    }

    /// Sleeps until `timer` runs out or, after a change of `health_vs`
    /// (`changed` fires; it is then taken), until `max_interval` after
    /// `began` (and a random share of `max_interval` after the change),
    /// whichever is first. Without a watch (it could not be armed), it
    /// looks every `max_interval`. Returns false if the reaper was
    /// cancelled.
    ///
    /// A change that may be this node's own heartbeat (one of its renewals
    /// began since the watch was armed, at `armed_at_commits`) is looked
    /// at without the random delay: the heartbeat delivers nothing for the
    /// pass to fall in step with, and the pass then runs in the wake-up the
    /// heartbeat's commit already made instead of two more of its own (a
    /// sleep of over 64 ms costs tokio's timer wheel two). Passing sooner
    /// never reaps sooner: the observer's rule decides that.
    async fn wait(
        &self,
        began: Instant,
        timer: Option<Duration>,
        changed: &mut Option<Watch>,
        armed_at_commits: u64,
    ) -> bool {
        let deadline = timer.map(|t| tokio::time::Instant::now() + t);
        let until_deadline = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        // No watch, or a failed one (a store hiccup, too many watches),
        // counts as a change: look again at the polling cadence.
        let change = async {
            if let Some(watch) = changed.as_mut() {
                let _ = watch.await;
            }
        };
        // Where the store spares this handle's watches for the node's own
        // renewals, the heartbeat service tells of them in-process; the
        // watch, which they did not fire, stays armed.
        let spared = self.ctx.db.spares_own_watches();
        let renewed = async {
            if spared {
                self.own.renewed.notified().await
            } else {
                std::future::pending().await
            }
        };
        let own = tokio::select! {
            _ = self.cancel.cancelled() => return false,
            () = until_deadline => return true,
            () = renewed => true,
            () = change => {
                // Fired (or missing): the next pass arms a new one.
                *changed = None;
                // Without sparing, the node's own renewal fires the watch:
                // one begun since it was armed may be what fired it.
                !spared && self.own.transactions() > armed_at_commits
            }
        };
        // At a random moment within `max_interval` of the change, not at
        // a fixed delay after it: a pass (a write transaction and a scan)
        // must not fall in step with the commits that woke it, next to
        // the deliveries of what they did, whose latency is what counts.
        let after_change = if own { Duration::ZERO } else { self.max_interval.mul_f64(rand::random::<f64>()) };
        // For tests that count which changes were taken for the node's own.
        let _ = tracing::debug_span!(target: TARGET, "reaper_after_change", own = own);
        let soonest = tokio::time::Instant::from_std(began + jittered(self.max_interval, JITTER))
            .max(tokio::time::Instant::now() + after_change);
        let at = deadline.map_or(soonest, |d| d.min(soonest));
        tokio::select! {
            _ = self.cancel.cancelled() => false,
            _ = tokio::time::sleep_until(at) => true,
        }
    }

    /// One pass; returns the time until the next possible death. Arms a
    /// watch on `health_vs` at the pass's first read version into
    /// `changed` if it holds none.
    async fn pass(&self, observer: &mut Observer, changed: &mut Option<Watch>) -> Result<Option<Duration>, StoreError> {
        let writable = self.tx(observer, true);
        let (pulse, health_vs) = (&self.ctx.ks.reaper_pulse(), &self.ctx.ks.health_vs());
        // Where versions follow time (the embedded store), the empty write
        // transaction alone shows the store writable (it takes SQLite's
        // write lock), and a write would only wake every node's watcher.
        let add_pulse = !self.ctx.db.versions_follow_time();
        let arm = changed.is_none();
        let span = tracing::debug_span!(target: TARGET, "reaper_pass", armed = arm);
        async {
            let (watch, _) = self
                .look(observer, writable, |tx, _| async move {
                    // A blind atomic add: no read conflict, so concurrent
                    // passes of every node's reaper all commit.
                    if add_pulse {
                        tx.atomic_add(pulse, 1);
                    }
                    let watch = arm.then(|| tx.watch(health_vs));
                    tx.read_version().await.map(|v| (watch, v))
                })
                .await?;
            if watch.is_some() {
                *changed = watch;
            }
            let scan = self.scan(observer).await?;
            observer.end_pass();
            for suspect in &scan.suspects {
                if self.cancel.is_cancelled() || !self.reap(observer, suspect).await? {
                    break;
                }
            }
            Ok(scan.next_death)
        }
        .instrument(span)
        .await
    }

    /// Options of a reaper transaction: cut off at the stall bound, since
    /// a longer one restarts the observation anyway.
    fn tx(&self, observer: &Observer, writes: bool) -> TxOptions {
        TxOptions { writes, timeout: self.ctx.write.timeout.min(observer.stall_bound()), ..self.ctx.write }
    }

    /// Runs `f` (which returns its value and the transaction's read
    /// version) and shows the transaction to the observer.
    async fn look<T, F, Fut>(&self, observer: &mut Observer, opts: TxOptions, f: F) -> Result<(T, Look), StoreError>
    where
        F: FnMut(Tx, Attempt) -> Fut,
        Fut: Future<Output = Result<(T, u64), StoreError>>,
    {
        let started = Instant::now();
        let ((value, read_version), commit) = run_attempts(self.ctx.db.as_ref(), opts, f).await?;
        // A transaction that committed shows the observer its commit
        // version: FoundationDB's read version is the last commit's, which
        // on an otherwise idle cluster is the previous pass's pulse, one
        // reaper cadence old, while the scan right after this pass's pulse
        // reads at the pulse's commit; compared with that stale read
        // version, the versions between looks a few milliseconds apart
        // spanned a whole cadence, which the observer once counted as a
        // `version_jump` at every pass (a dead worker was never reaped).
        // A commit version is given out within this look, every later read
        // version is at least it, and what the transaction read held at it
        // (its read conflicts would have failed the commit otherwise).
        let read_version = commit.version.map_or(read_version, |c| c.max(read_version));
        let look = Look { read_version, started, finished: Instant::now() };
        // The bound the look is judged by (a restart resets it).
        let bound = observer.stall_bound();
        if let Some(why) = observer.look(look) {
            self.note_restart(why, bound);
        }
        Ok((value, look))
    }

    fn note_restart(&self, why: Restart, bound: Duration) {
        let bound_ms = i64::try_from(bound.as_millis()).unwrap_or(i64::MAX);
        log_event!(
            self.ctx.log,
            Notice,
            "reaper_observation_restarted",
            reason = why.name(),
            stall_bound_ms = bound_ms
        );
    }

    /// Reaps one suspect if its record is still the one observed. Returns
    /// whether the pass may go on reaping (false: observation restarted).
    async fn reap(&self, observer: &mut Observer, suspect: &Suspect) -> Result<bool, StoreError> {
        let Some(since) = observer.last_finished() else { return Ok(false) };
        let bound = observer.stall_bound();
        let (ks, s) = (&self.ctx.ks, suspect);
        let (worker_type, id) = (&s.worker.0, &s.worker.1);
        let opts = self.tx(observer, true);
        // A reap answered `commit_unknown_result` that landed finds the
        // worker gone when it runs again: its receipt says it was this
        // reap, and how many jobs it failed over (see `store::receipt`).
        let safe = RetrySafe::new(self.ctx.db.as_ref(), ks);
        let safe = &safe;
        let reaped = self
            .look(observer, opts, |tx, attempt| async move {
                let read_version = tx.read_version().await?;
                let t = tx.clone();
                let reaped = safe
                    .attempt(&t, attempt, |landed| async move {
                        if let Some(outcome) = landed {
                            return Ok((Some(receipt::parse_count(&outcome)), None));
                        }
                        // Waiting for the store (another process's write
                        // lock) or being held up since the last look is a
                        // stall: the store may not have taken the worker's
                        // heartbeats meanwhile.
                        if since.elapsed() > bound {
                            return Err(StoreError::TimedOut);
                        }
                        let reaped = roster::reap_with_jobs(&tx, ks, worker_type, id, &s.record).await?;
                        Ok((reaped, reaped.map(receipt::count_outcome)))
                    })
                    .await?;
                Ok((reaped, read_version))
            })
            .instrument(
                tracing::debug_span!(target: TARGET, "reap", "type" = worker_type.as_slice(), id = id.as_slice()),
            )
            .await;
        observer.forget(&suspect.worker);
        match reaped {
            Ok((Some(jobs), _)) => {
                // `jobs`: its running jobs this reap failed over (the
                // metrics' `jobs_requeued`).
                log_event!(
                    self.ctx.log,
                    Notice,
                    "worker_reaped",
                    "type" = worker_type.as_slice(),
                    id = id.as_slice(),
                    jobs = jobs
                );
            }
            Ok((None, _)) => {}
            Err(e) if is_this_workers_fault(&e) => self.log_reap_failed(suspect, &e),
            Err(e) => {
                self.log_reap_failed(suspect, &e);
                return Err(e);
            }
        }
        Ok(observer.last_finished().is_some())
    }

    fn log_reap_failed(&self, suspect: &Suspect, e: &StoreError) {
        let (t, id) = (suspect.worker.0.as_slice(), suspect.worker.1.as_slice());
        log_event!(self.ctx.log, Warning, "reap_failed", "type" = t, id = id, reason = %e);
    }

    /// Reads every health record, up to [`SCAN_BATCH`] keys a transaction:
    /// each transaction goes on from where the last one stopped, finding
    /// the next worker type itself, so that a store with a few workers is
    /// scanned in one.
    async fn scan(&self, observer: &mut Observer) -> Result<Scan, StoreError> {
        let mut scan = Scan::default();
        let mut at = ScanAt::Seek(self.ctx.ks.all_workers_range().0);
        while at != ScanAt::End {
            let opts = self.tx(observer, false);
            let from = &at;
            let ((rows, next), look) = self
                .look(observer, opts, |tx, _| async move {
                    let batch = self.scan_batch(&tx, from.clone()).await?;
                    Ok((batch, tx.read_version().await?))
                })
                .await?;
            for (worker_type, key, value) in &rows {
                let Some(WorkerKey::Health { worker, .. }) = self.ctx.ks.parse_worker_key(key) else { continue };
                let worker = (worker_type.clone(), worker);
                match observer.judge(&worker, value, &look) {
                    Verdict::Dead => scan.suspects.push(Suspect { worker, record: value.clone() }),
                    Verdict::Alive { left } => scan.next_death = Some(scan.next_death.map_or(left, |n| n.min(left))),
                }
            }
            at = next;
        }
        Ok(scan)
    }

    /// One scan transaction's reads from `at`: health records as (worker
    /// type, key, value), and where the next transaction goes on. At most
    /// [`SCAN_BATCH`] keys read, each read counting one at least (so that
    /// a store of many types without workers is still read in bounded
    /// transactions).
    async fn scan_batch(&self, tx: &Tx, mut at: ScanAt) -> Result<(Vec<HealthRow>, ScanAt), StoreError> {
        let all_end = self.ctx.ks.all_workers_range().1;
        let mut rows: Vec<HealthRow> = Vec::new();
        let mut budget = SCAN_BATCH;
        while budget > 0 {
            match at {
                ScanAt::End => break,
                ScanAt::Seek(cursor) => {
                    budget -= 1;
                    // The next worker type at or after the cursor.
                    let r = RangeRequest::new(cursor, all_end.clone()).limit(1).snapshot(true);
                    let Some((key, _)) = tx.get_range(&r).await?.into_iter().next() else {
                        at = ScanAt::End;
                        break;
                    };
                    at = match self.ctx.ks.parse_worker_key(&key) {
                        Some(WorkerKey::Vs { worker_type })
                        | Some(WorkerKey::Member { worker_type, .. })
                        | Some(WorkerKey::Health { worker_type, .. })
                        | Some(WorkerKey::Log { worker_type, .. })
                        | Some(WorkerKey::LogFloor { worker_type })
                        | Some(WorkerKey::Registered { worker_type, .. })
                        | Some(WorkerKey::Seniority { worker_type, .. }) => {
                            let begin = self.ctx.ks.health_range(&worker_type).0;
                            ScanAt::Health { worker_type, begin }
                        }
                        None => {
                            // A key of no known shape: step over it.
                            let mut next = key;
                            next.push(0);
                            ScanAt::Seek(next)
                        }
                    };
                }
                ScanAt::Health { worker_type, begin } => {
                    let end = self.ctx.ks.health_range(&worker_type).1;
                    let r = RangeRequest::new(begin, end).limit(budget).snapshot(true);
                    let found = tx.get_range(&r).await?;
                    let full = found.len() == budget;
                    budget -= found.len().clamp(1, budget);
                    at = match found.last() {
                        Some((last, _)) if full => {
                            let mut begin = last.clone();
                            begin.push(0);
                            ScanAt::Health { worker_type: worker_type.clone(), begin }
                        }
                        // Skip past every key of this type.
                        _ => ScanAt::Seek(self.ctx.ks.worker_type_range(&worker_type).1),
                    };
                    rows.extend(found.into_iter().map(|(k, v)| (worker_type.clone(), k, v)));
                }
            }
        }
        Ok((rows, at))
    }
}

/// A health record the scan read: its worker type, key and value.
type HealthRow = (Vec<u8>, Vec<u8>, Vec<u8>);

/// Where a scan goes on.
#[derive(Clone, PartialEq, Eq)]
enum ScanAt {
    /// At the next worker type at or after this key.
    Seek(Vec<u8>),
    /// In `worker_type`'s health records, from `begin`.
    Health {
        worker_type: Vec<u8>,
        begin: Vec<u8>,
    },
    End,
}

/// Errors that say something about the one worker's removal (its jobs are
/// too many for one transaction, a key of it is malformed), not about the
/// store: they leave the observation of the others standing.
fn is_this_workers_fault(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::TransactionTooLarge | StoreError::KeyTooLarge | StoreError::ValueTooLarge | StoreError::Invalid(_)
    )
}
