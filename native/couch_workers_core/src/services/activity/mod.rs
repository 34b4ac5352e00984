//! The activity observer: every node runs one; it takes back the running
//! jobs of this node's workers whose records did not change for their
//! activity timeout (`jobs/activity.rs` keeps the index it reads).
//!
//! Measured as the reaper measures a worker's heartbeats (`liveness/`,
//! `looks.rs`): a job is due only once this observer has itself seen its
//! record unchanged for the timeout, in store versions and on its own
//! monotonic clock, while the store took its writes. A store stall, a
//! paused node's return or a FoundationDB recovery starts the observation
//! again (every job then has a whole timeout again); no wall clock is
//! read.
//!
//! A pass: a write transaction (an atomic add to `reaper_pulse` where
//! versions do not follow time, as the reaper's: it shows the store
//! writable and keeps FoundationDB's versions moving with time; the
//! embedded store needs no write for either), then the index in read
//! transactions of at most [`SCAN_BATCH`] keys: for each `(JobType,
//! TimeoutS)` its oldest key (one read), and only if that one is due the
//! keys up to the cutoff. A pass thus reads one key per type and timeout
//! plus the due ones, whatever the number of running jobs. Then each due
//! job of this node's workers is taken back in a transaction of its own
//! (`jobs::ops::take_back`) that re-reads the record and commits only if
//! its versionstamp is still the indexed one: several observers (this
//! one restarted while the old one's transaction was in flight) take a
//! job back once, and never after an update.
//!
//! Why only the worker's own node takes its jobs back: that node is where
//! its owner is, so the owner is told right after the commit
//! (`OwnerEvent::JobTimedOut`), with no notice key to write and watch. A
//! worker whose node is gone stops heartbeating, and its reap gives its
//! jobs back (`worker_lost`): no other node needs to stand in. The price:
//! a node whose observer cannot run (it keeps failing, and is restarted)
//! leaves its own workers' jobs running past their timeouts; due keys of
//! other nodes' workers are read and left alone.
//!
//! Between passes: while anything is indexed, at most a stall bound (a
//! quarter of the smallest timeout seen, at most [`MAX_SLEEP`]), jittered
//! down; so a due job is taken back within a quarter of its timeout. With
//! an empty index, until `activity_vs` changes (every accept that writes
//! an index key bumps it; the watch is armed in the transaction that
//! found the index empty, so no such accept is missed), or [`IDLE_CAP`]:
//! a node whose jobs have no timeout runs no transaction on a timer.
//! While a job type has a default timeout, [`IDLE_POLL`] at most: an
//! update can index a job that ran unindexed (accepted before the
//! default was read), and does not bump that key.

mod looks;

pub use looks::Looks;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::owner_events::{OwnerEvent, OwnerEvents};
use crate::context::Context;
use crate::jobs::ops::{clear_if_stale, take_back, Due, TakeBack};
use crate::jobs::TypeSettings;
use crate::keyspace::Keyspace;
use crate::liveness::{Look, Restart};
use crate::log::TARGET;
use crate::log_event;
use crate::store::receipt::{RetrySafe, DONE};
use crate::store::{run_attempts, RangeRequest, StoreError, Tx, TxOptions, Watch};
use crate::tasks::{jittered, sleep_or_cancel};

/// Index keys read per scan transaction.
pub const SCAN_BATCH: usize = 1000;

/// The sleep after a failed pass, or a failed watch.
pub const IDLE_POLL: Duration = Duration::from_secs(1);

/// The longest sleep while nothing is indexed (a safety pass, should a
/// change of `activity_vs` go unseen).
pub const IDLE_CAP: Duration = Duration::from_secs(30);

/// The longest sleep between passes while something is indexed.
pub const MAX_SLEEP: Duration = Duration::from_secs(5);

/// The smallest timeout a job can have.
const MIN_TIMEOUT: Duration = Duration::from_secs(1);

/// The jitter of the sleep between passes (a share of it, downwards).
const JITTER: f64 = 0.2;

/// This node's registrations, as the observer needs them: who owns a
/// worker (the node's heartbeat registry).
pub trait LocalWorkers: Send + Sync {
    /// The owner channel of every worker registered on this node, by
    /// `(worker type, worker id)`.
    fn owners(&self) -> HashMap<(Vec<u8>, Vec<u8>), Arc<OwnerEvents>>;
}

/// What the observer did, for tests and stats.
#[derive(Debug, Default)]
pub struct ActivityCounts {
    pub passes: AtomicU64,
    /// Index keys read.
    pub examined: AtomicU64,
    /// Jobs taken back.
    pub taken_back: AtomicU64,
}

/// One observation: the looks since it (re)started, the smallest
/// timeout in the index at the last pass (the stall bound's base), and,
/// while the index is empty, the watch on `activity_vs`.
#[derive(Default)]
pub struct Observation {
    looks: Looks,
    min_timeout: Option<Duration>,
    idle: Option<Watch>,
}

impl Observation {
    /// How long a look may take, and by how much it may come late: a
    /// quarter of the smallest timeout (as the reaper's, `liveness/`).
    pub fn stall_bound(&self) -> Duration {
        self.min_timeout.unwrap_or(MIN_TIMEOUT) / 4
    }

    /// The longest the observer plans to sleep between looks.
    fn max_sleep(&self) -> Duration {
        self.stall_bound().min(MAX_SLEEP)
    }

    pub fn restart(&mut self) {
        self.looks.restart();
    }
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    /// Index keys read.
    pub examined: u64,
    /// Jobs this pass took back, with their workers.
    pub taken: Vec<(Due, Vec<u8>)>,
    /// Something was indexed.
    pub indexed: bool,
}

/// A due key, with the worker it names.
struct DueKey {
    due: Due,
    worker: Vec<u8>,
    /// Due for a second timeout already.
    overdue: bool,
}

#[derive(Clone)]
pub struct ActivityObserver {
    pub ctx: Arc<Context>,
    pub cancel: CancellationToken,
    pub local: Arc<dyn LocalWorkers>,
    pub counts: Arc<ActivityCounts>,
}

impl ActivityObserver {
    /// The observer's loop; supervised: a restart starts observing again,
    /// which never takes a job back sooner.
    pub async fn run(self) {
        let mut obs = Observation::default();
        loop {
            let sleep = match self.pass(&mut obs).await {
                Ok(pass) if pass.indexed => obs.max_sleep().mul_f64(1.0 - JITTER * rand::random::<f64>()),
                Ok(_) => {
                    obs.restart();
                    if !self.idle(&mut obs).await {
                        return;
                    }
                    continue;
                }
                Err(e) => {
                    if self.cancel.is_cancelled() {
                        return;
                    }
                    obs.restart();
                    log_event!(self.ctx.log, Warning, "activity_pass_failed", reason = %e);
                    jittered(IDLE_POLL, JITTER)
                }
            };
            if !sleep_or_cancel(sleep, &self.cancel).await {
                return;
            }
        }
    }

    /// Sleeps while the index is empty: until its watch fires, or
    /// [`IDLE_CAP`]; after a failed watch (or with none), [`IDLE_POLL`].
    /// While a type has a default timeout, at most [`IDLE_POLL`]: a change
    /// of a running job of it indexes the job without bumping the watched
    /// key (only an accept does). Returns false if the observer was
    /// cancelled.
    async fn idle(&self, obs: &mut Observation) -> bool {
        let Some(watch) = obs.idle.take() else {
            return sleep_or_cancel(jittered(IDLE_POLL, JITTER), &self.cancel).await;
        };
        let cap = if self.ctx.ks.type_timeouts().is_empty() { IDLE_CAP } else { IDLE_POLL };
        let failed = tokio::select! {
            _ = self.cancel.cancelled() => return false,
            _ = tokio::time::sleep(jittered(cap, JITTER)) => false,
            fired = watch => fired.is_err(),
        };
        !failed || sleep_or_cancel(jittered(IDLE_POLL, JITTER), &self.cancel).await
    }

    /// Options of an observer transaction: cut off at the stall bound,
    /// since a longer one restarts the observation anyway.
    fn tx(&self, obs: &Observation, writes: bool) -> TxOptions {
        TxOptions { writes, timeout: self.ctx.write.timeout.min(obs.stall_bound()), ..self.ctx.write }
    }

    /// Records a look; logs a restart while something was observed.
    fn record(&self, obs: &mut Observation, look: Look) -> Option<Restart> {
        let (bound, max_sleep) = (obs.stall_bound(), obs.max_sleep());
        let why = obs.looks.look(look, bound, max_sleep);
        if let (Some(why), Some(_)) = (why, obs.min_timeout) {
            let bound_ms = i64::try_from(bound.as_millis()).unwrap_or(i64::MAX);
            log_event!(
                self.ctx.log,
                Notice,
                "activity_observation_restarted",
                reason = why.name(),
                stall_bound_ms = bound_ms
            );
        }
        why
    }

    /// One pass: a writable look, the scan, and the take-backs.
    pub async fn pass(&self, obs: &mut Observation) -> Result<Pass, StoreError> {
        let span = tracing::debug_span!(target: TARGET, "activity_pass");
        async {
            self.counts.passes.fetch_add(1, Ordering::Relaxed);
            self.writable_look(obs).await?;
            let mut pass = Pass::default();
            let due = self.scan(obs, &mut pass).await?;
            self.counts.examined.fetch_add(pass.examined, Ordering::Relaxed);
            if due.is_empty() {
                return Ok(pass);
            }
            let owners = self.local.owners();
            for key in due {
                if self.cancel.is_cancelled() {
                    break;
                }
                // Another node's worker: its node takes it back. One left
                // due for a second timeout may be a key its record left
                // behind (see `jobs/activity.rs`), which nobody else
                // would clear.
                let Some(events) = owners.get(&(key.due.job_type.clone(), key.worker.clone())) else {
                    if key.overdue {
                        self.clear_if_stale(self.tx(obs, true), &key.due).await?;
                    }
                    continue;
                };
                match self.take(obs, &key.due).await? {
                    Some(TakeBack::Taken { worker, .. }) => {
                        self.told(&key.due, &worker, events);
                        pass.taken.push((key.due, worker));
                    }
                    Some(TakeBack::Changed) => {}
                    // The observation restarted: the rest waits.
                    None => break,
                }
            }
            Ok(pass)
        }
        .instrument(span)
        .await
    }

    /// The pass's first look, in a transaction that writes. It also reads
    /// the types' default timeouts, which this node's writes of running
    /// jobs index by (`Keyspace::type_timeouts`).
    async fn writable_look(&self, obs: &mut Observation) -> Result<(), StoreError> {
        let ks = &self.ctx.ks;
        let pulse = &ks.reaper_pulse();
        let add_pulse = !self.ctx.db.versions_follow_time();
        let started = Instant::now();
        let ((read_version, defaults), commit) =
            run_attempts(self.ctx.db.as_ref(), self.tx(obs, true), |tx, _| async move {
                if add_pulse {
                    tx.atomic_add(pulse, 1);
                }
                let defaults = type_timeouts(&tx, ks).await?;
                Ok((tx.read_version().await?, defaults))
            })
            .await?;
        ks.type_timeouts().set_all(defaults);
        // Its commit version where it committed one (see the reaper's
        // `look`: a quiet FoundationDB's read versions lag).
        let read_version = commit.version.map_or(read_version, |c| c.max(read_version));
        self.record(obs, Look { read_version, started, finished: Instant::now() });
        Ok(())
    }

    /// Reads the index: the due keys, each read once.
    async fn scan(&self, obs: &mut Observation, pass: &mut Pass) -> Result<Vec<DueKey>, StoreError> {
        let end = self.ctx.ks.activity_range().1;
        let mut cursor = self.ctx.ks.activity_range().0;
        let mut due = Vec::new();
        let mut min_timeout: Option<i64> = None;
        // The first transaction arms the idle watch if it finds the index
        // empty (and none is armed).
        let mut arm = obs.idle.is_none();
        obs.idle = None;
        while cursor < end {
            let started = Instant::now();
            let opts = self.tx(obs, false);
            let (looks, from, end) = (&obs.looks, &cursor, &end);
            let (batch, _) = run_attempts(self.ctx.db.as_ref(), opts, |tx, _| async move {
                let read_version = tx.read_version().await?;
                let now = Look { read_version, started, finished: started };
                let mut batch = self.scan_batch(&tx, looks, &now, from.clone(), end).await?;
                if arm && batch.examined == 0 {
                    batch.idle = Some(tx.watch(&self.ctx.ks.activity_vs()));
                }
                Ok((batch, read_version))
            })
            .await?;
            arm = false;
            let (mut batch, read_version) = batch;
            obs.idle = batch.idle.take();
            pass.examined += batch.examined;
            pass.indexed |= batch.examined > 0;
            min_timeout = match (min_timeout, batch.min_timeout) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if self.record(obs, Look { read_version, started, finished: Instant::now() }).is_some() {
                // What this look read may span a stall: nothing is due.
                due.clear();
                break;
            }
            due.extend(batch.due);
            cursor = batch.next;
        }
        obs.min_timeout = min_timeout.and_then(|t| u64::try_from(t).ok()).map(Duration::from_secs);
        Ok(due)
    }

    /// One scan transaction's reads from `cursor`: at most [`SCAN_BATCH`]
    /// keys, each read counted.
    async fn scan_batch(
        &self,
        tx: &Tx,
        looks: &Looks,
        now: &Look,
        mut cursor: Vec<u8>,
        end: &[u8],
    ) -> Result<Batch, StoreError> {
        let ks = &self.ctx.ks;
        let mut batch = Batch::default();
        let mut budget = SCAN_BATCH;
        while budget > 0 && cursor.as_slice() < end {
            // The oldest key of the next type and timeout.
            let r = RangeRequest::new(cursor.clone(), end.to_vec()).limit(1).snapshot(true);
            let Some((first, _)) = tx.get_range(&r).await?.into_iter().next() else {
                cursor = end.to_vec();
                break;
            };
            batch.examined += 1;
            budget -= 1;
            let Some((job_type, timeout_s, vs, _)) = ks.parse_activity(&first) else {
                // A key of no known shape: step over it.
                cursor = first;
                cursor.push(0);
                continue;
            };
            batch.min_timeout = Some(batch.min_timeout.map_or(timeout_s, |m| m.min(timeout_s)));
            let bucket_end = ks.activity_bucket_range(&job_type, timeout_s).1;
            let timeout = Duration::from_secs(u64::try_from(timeout_s).unwrap_or(0).max(1));
            let cutoff = looks.cutoff(timeout, now).filter(|c| commit_version(&vs) <= *c);
            let overdue_by = looks.cutoff(timeout * 2, now);
            let Some(cutoff) = cutoff else {
                cursor = bucket_end;
                continue;
            };
            // The oldest is due: every key up to the cutoff (the first
            // again, already counted).
            let limit = budget + 1;
            let r = RangeRequest::new(first, ks.activity_after(&job_type, timeout_s, cutoff)).limit(limit).snapshot(true);
            let rows = tx.get_range(&r).await?;
            let full = rows.len() == limit;
            batch.examined += rows.len().saturating_sub(1) as u64;
            budget = budget.saturating_sub(rows.len().saturating_sub(1));
            cursor = match rows.last() {
                Some((last, _)) if full => {
                    let mut next = last.clone();
                    next.push(0);
                    next
                }
                _ => bucket_end,
            };
            for (key, worker) in rows {
                if let Some((job_type, timeout_s, vs, id)) = ks.parse_activity(&key) {
                    let overdue = overdue_by.is_some_and(|c| commit_version(&vs) <= c);
                    batch.due.push(DueKey { due: Due { job_type, timeout_s, vs, id }, worker, overdue });
                }
            }
        }
        batch.next = cursor;
        Ok(batch)
    }

    /// Takes `due` back in a transaction of its own, which is a look too.
    /// `None`: it came too long after the last look (a stall), or showed
    /// one; the observation restarted and nothing was written.
    async fn take(&self, obs: &mut Observation, due: &Due) -> Result<Option<TakeBack>, StoreError> {
        let Some(since) = obs.looks.last().map(|l| l.finished) else { return Ok(None) };
        let bound = obs.stall_bound();
        let (ks, db) = (&self.ctx.ks, self.ctx.db.as_ref());
        // A take-back answered `commit_unknown_result` that landed finds
        // the record changed when it runs again: its receipt says it was
        // this one, so that the owner is still told.
        let safe = RetrySafe::new(db, ks);
        let safe = &safe;
        let started = Instant::now();
        let span = tracing::debug_span!(target: TARGET, "activity_take_back");
        let run = run_attempts(db, self.tx(obs, true), |tx, attempt| async move {
            let read_version = tx.read_version().await?;
            let t = tx.clone();
            let taken = safe
                .attempt(&t, attempt, |landed| async move {
                    if let Some(outcome) = landed {
                        let worker = outcome.strip_prefix(DONE).map(<[u8]>::to_vec).unwrap_or_default();
                        let state = crate::jobs::JobState::Pending;
                        return Ok((Some(TakeBack::Taken { worker, state }), None));
                    }
                    // Held up since the last look: the store may not have
                    // taken the worker's updates meanwhile.
                    if since.elapsed() > bound {
                        return Ok((None, None));
                    }
                    let taken = take_back(&tx, ks, due).await?;
                    let receipt = match &taken {
                        TakeBack::Taken { worker, .. } => Some([DONE, worker].concat()),
                        TakeBack::Changed => None,
                    };
                    Ok((Some(taken), receipt))
                })
                .await?;
            Ok((taken, read_version))
        })
        .instrument(span)
        .await;
        let ((taken, read_version), commit) = match run {
            Ok(done) => done,
            Err(e) => {
                obs.restart();
                return Err(e);
            }
        };
        let read_version = commit.version.map_or(read_version, |c| c.max(read_version));
        // (A take-back that committed stands whatever its look shows: it
        // decided within a stall bound of the last look.)
        self.record(obs, Look { read_version, started, finished: Instant::now() });
        if taken.is_none() {
            obs.restart();
        }
        Ok(taken)
    }

    /// Clears the key of `due` if its record no longer is the one the key
    /// was written with (never a take-back: the worker is another node's).
    async fn clear_if_stale(&self, opts: TxOptions, due: &Due) -> Result<(), StoreError> {
        let ks = &self.ctx.ks;
        run_attempts(self.ctx.db.as_ref(), opts, |tx, _| async move {
            clear_if_stale(&tx, ks, due).await
        })
        .await?;
        Ok(())
    }

    /// After the commit: counted, logged (the telemetry event), and told
    /// to the worker's owner.
    fn told(&self, due: &Due, worker: &[u8], events: &OwnerEvents) {
        self.counts.taken_back.fetch_add(1, Ordering::Relaxed);
        log_event!(
            self.ctx.log,
            Notice,
            "job_timed_out",
            "type" = due.job_type.as_slice(),
            id = due.id.as_slice(),
            worker = worker,
            timeout_s = due.timeout_s
        );
        events.emit(OwnerEvent::JobTimedOut { job_type: due.job_type.clone(), job_id: due.id.clone() });
    }
}

/// Most types whose settings one pass reads.
const MAX_TYPES: usize = 10_000;

/// The default activity timeouts of the types that have a finite one.
async fn type_timeouts(tx: &Tx, ks: &Keyspace) -> Result<HashMap<Vec<u8>, i64>, StoreError> {
    let (begin, end) = ks.type_settings_range();
    let rows = tx.get_range(&RangeRequest::new(begin, end).limit(MAX_TYPES).snapshot(true)).await?;
    let mut by_type = HashMap::new();
    for (key, value) in rows {
        // A value no reader can decode sets no timeout.
        let timeout = TypeSettings::decode(&value).ok().and_then(|s| s.activity_timeout);
        if let (Some(job_type), Some(t)) = (ks.parse_type_settings(&key), timeout.and_then(|t| i64::try_from(t).ok())) {
            by_type.insert(job_type, t);
        }
    }
    Ok(by_type)
}

/// The commit version of a 12-byte versionstamp.
fn commit_version(vs: &[u8; 12]) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&vs[..8]);
    u64::from_be_bytes(v)
}

/// What one scan transaction read.
#[derive(Default)]
struct Batch {
    /// Armed when the index was found empty.
    idle: Option<Watch>,
    due: Vec<DueKey>,
    examined: u64,
    min_timeout: Option<i64>,
    /// Where the next transaction goes on.
    next: Vec<u8>,
}
