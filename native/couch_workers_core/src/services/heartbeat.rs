//! The heartbeat service: one per node, renewing all of the node's
//! registered workers in as few transactions as the store's limits allow.
//!
//! Each registration is renewed about every third of its timeout, so that
//! two heartbeats can be lost before the worker is reaped (the
//! foundationdb-rs leader-election recipe renews at the same ratio). A
//! renewal is due at most a period after the start of the last one that
//! committed (jittered into the last tenth of it, so that nodes do not
//! fall into step); once half a period has passed it may be renewed early.
//! The service wakes at the earliest due time and renews every
//! registration that may be renewed then, in transactions of at most
//! [`CHUNK_WORKERS`] workers and about [`CHUNK_BYTES`] of keys, most
//! urgent first: workers with one timeout fall into one batch per period,
//! so a node's heartbeat transactions per period grow with its workers
//! over a thousand, not with its workers; workers with different timeouts
//! each keep their own period.
//!
//! A failed renewal is logged (one `heartbeat_failed` per worker, as the
//! per-type metrics count them) and retried sooner (a sixth of the period);
//! it never gives up while the registration lives. A chunk that fails for
//! a reason that may be one worker's (too large) is retried one worker per
//! transaction, so one worker cannot hold back the others. A registration
//! whose id another incarnation holds (`Heartbeat::Gone`) is not ours to
//! renew: it leaves the service. Both a reinstatement and a replacement
//! are told to the registration's owner (`owner_events`), exactly once,
//! also when the reinstating commit landed but was answered
//! `commit_unknown_result` (its receipt; see `renew`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::owner_events::{OwnerEvent, OwnerEvents};
use super::wall_clock_s;
use crate::context::Context;
use crate::keyspace::{Incarnation, Keyspace};
use crate::log::TARGET;
use crate::log_event;
use crate::store::receipt::run_retry_safe;
use crate::store::StoreError;
use crate::roster::{self, Beat};
use crate::tasks::{jittered, Live};
use crate::workers::{Heartbeat, WorkerSpec};

/// Most workers renewed in one transaction.
pub const CHUNK_WORKERS: usize = 1000;

/// About the most key bytes (each worker's health key is read and written)
/// one renewal transaction carries: far inside FoundationDB's 10 MB.
pub const CHUNK_BYTES: usize = 1 << 20;

/// Bytes a worker adds to a chunk besides its key's twice (read and
/// write): the value and the per-key overhead.
const BYTES_PER_WORKER: usize = 128;

/// The renewal period for a timeout: a third of it.
pub fn period(timeout_s: u64) -> Duration {
    Duration::from_millis(timeout_s.saturating_mul(1000) / 3)
}

/// One registration the service renews.
struct Entry {
    spec: Arc<WorkerSpec>,
    incarnation: Incarnation,
    /// Cancelled when its owner ends the registration.
    cancel: CancellationToken,
    events: Arc<OwnerEvents>,
    /// From when it may be renewed (early, with others).
    open: Instant,
    /// By when it must be renewed.
    due: Instant,
    failures: u32,
    /// A renewal of it is running.
    in_flight: bool,
    /// Counts it in `Stats::heartbeats` for as long as it is here.
    _live: Live,
}

/// The registrations of a node, shared by the node (which adds and
/// removes them) and the service task (which renews them).
#[derive(Default)]
pub(crate) struct Heartbeats {
    entries: Mutex<HashMap<Incarnation, Entry>>,
    /// Told when a registration is added: it may be due before the
    /// service's planned wake.
    added: Notify,
    /// Renewal transaction runs begun.
    transactions: AtomicU64,
    /// Told after a wake-up of the service in which a renewal committed:
    /// the reaper looks then (`reaper.rs`). Its renewals spare the
    /// store's watches of `health_vs` on this handle where the store can
    /// (`Transaction::spare_own_watches`), so this is how the node's own
    /// reaper hears of them.
    pub(crate) renewed: Notify,
}

/// A registration to renew, copied out of the registry.
struct Due {
    spec: Arc<WorkerSpec>,
    incarnation: Incarnation,
    cancel: CancellationToken,
    due: Instant,
}

impl Heartbeats {
    fn lock(&self) -> MutexGuard<'_, HashMap<Incarnation, Entry>> {
        // A panic while holding the lock leaves the map consistent (every
        // change is a single insert or field store), so poisoning is moot.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a registration whose record was written by a transaction that
    /// began at `written`.
    pub(crate) fn add(
        &self,
        spec: Arc<WorkerSpec>,
        incarnation: Incarnation,
        cancel: CancellationToken,
        events: Arc<OwnerEvents>,
        written: Instant,
        live: Live,
    ) {
        let p = period(spec.timeout_s);
        let entry = Entry {
            spec,
            incarnation,
            cancel,
            events,
            open: written + p / 2,
            due: next_due(written, p),
            failures: 0,
            in_flight: false,
            _live: live,
        };
        self.lock().insert(incarnation, entry);
        self.added.notify_one();
    }

    /// Stops renewing a registration (its owner ended it).
    pub(crate) fn remove(&self, incarnation: &Incarnation) {
        self.lock().remove(incarnation);
    }

    /// Forgets every registration (the node stopped).
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    /// Renewal transaction runs begun so far. Counted before each run,
    /// so before its commit can fire a watch: the reaper tells by it that
    /// a change of `health_vs` may be its own node's (see `reaper.rs`).
    pub(crate) fn transactions(&self) -> u64 {
        self.transactions.load(Ordering::Relaxed)
    }

    /// A (re)started service: no renewal is running any more (one cut
    /// short by a panic would otherwise stay in flight for ever).
    fn reset_in_flight(&self) {
        for entry in self.lock().values_mut() {
            entry.in_flight = false;
        }
    }

    /// Tells every registration's owner that the service keeps failing.
    pub(crate) fn tell_failing(&self) {
        let events: Vec<Arc<OwnerEvents>> = self.lock().values().map(|e| e.events.clone()).collect();
        // Outside the lock: a listener may call back into the node.
        for sink in events {
            sink.emit(OwnerEvent::HeartbeatFailing);
        }
    }

    fn next_wake(&self) -> Option<Instant> {
        self.lock().values().filter(|e| !e.in_flight).map(|e| e.due).min()
    }

    /// Takes every registration that may be renewed at `now`, most urgent
    /// first, and marks it in flight.
    fn take_open(&self, now: Instant) -> Vec<Due> {
        let mut entries = self.lock();
        let mut open: Vec<Due> = entries
            .values_mut()
            .filter(|e| !e.in_flight && e.open <= now)
            .map(|e| {
                e.in_flight = true;
                Due { spec: e.spec.clone(), incarnation: e.incarnation, cancel: e.cancel.clone(), due: e.due }
            })
            .collect();
        open.sort_by_key(|d| d.due);
        open
    }
}

/// The activity observer takes back only this node's workers' jobs, and
/// tells their owners.
impl super::activity::LocalWorkers for Heartbeats {
    fn owners(&self) -> HashMap<(Vec<u8>, Vec<u8>), Arc<OwnerEvents>> {
        let entries = self.lock();
        entries.values().map(|e| ((e.spec.worker_type.clone(), e.spec.id.clone()), e.events.clone())).collect()
    }
}

/// When a registration renewed by a transaction that began at `started`
/// must be renewed next: within the last tenth of a period after it.
fn next_due(started: Instant, period: Duration) -> Instant {
    started + period - jittered(period / 20, 1.0)
}

/// A renewal's receipt: the positions in its chunk of the registrations
/// it reinstated, each a big-endian `u32`.
fn encode_indices(indices: &[usize]) -> Vec<u8> {
    indices.iter().flat_map(|&i| u32::try_from(i).unwrap_or(u32::MAX).to_be_bytes()).collect()
}

fn parse_indices(value: &[u8]) -> Vec<usize> {
    value
        .chunks_exact(4)
        .filter_map(|b| <[u8; 4]>::try_from(b).ok())
        .filter_map(|b| usize::try_from(u32::from_be_bytes(b)).ok())
        .collect()
}

/// Splits `due` into renewal transactions within the chunk limits.
fn chunks(due: Vec<Due>, ks: &Keyspace) -> Vec<Vec<Due>> {
    let mut out: Vec<Vec<Due>> = Vec::new();
    let mut bytes = 0;
    for d in due {
        let size = 2 * ks.health(&d.spec.worker_type, &d.spec.id).len() + BYTES_PER_WORKER;
        match out.last_mut() {
            Some(chunk) if chunk.len() < CHUNK_WORKERS && bytes + size <= CHUNK_BYTES => {
                bytes += size;
                chunk.push(d);
            }
            _ => {
                bytes = size;
                out.push(vec![d]);
            }
        }
    }
    out
}

/// Errors that may come from one worker of a chunk (its reinstatement is
/// too large, a key of it is malformed) rather than from the store.
fn may_be_one_workers(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::TransactionTooLarge | StoreError::KeyTooLarge | StoreError::ValueTooLarge | StoreError::Invalid(_)
    )
}

#[derive(Clone)]
pub(crate) struct HeartbeatService {
    pub ctx: Arc<Context>,
    pub cancel: CancellationToken,
    pub heartbeats: Arc<Heartbeats>,
}

impl HeartbeatService {
    /// The service's loop; supervised (`supervise.rs`): a restart takes
    /// up the registrations where the last run left them.
    pub(crate) async fn run(self) {
        self.heartbeats.reset_in_flight();
        loop {
            let wake = self.heartbeats.next_wake();
            let sleep = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.cancel.cancelled() => break,
                _ = self.heartbeats.added.notified() => continue,
                _ = sleep => {}
            }
            let open = self.heartbeats.take_open(Instant::now());
            let mut committed = false;
            for chunk in chunks(open, &self.ctx.ks) {
                let done = tokio::select! {
                    _ = self.cancel.cancelled() => None,
                    c = self.renew_chunk(chunk) => Some(c),
                };
                match done {
                    Some(c) => committed |= c,
                    None => break,
                }
            }
            if committed {
                // Once per wake-up, after every chunk: one look sees them all.
                self.heartbeats.renewed.notify_one();
            }
            if self.cancel.is_cancelled() {
                break;
            }
        }
        // The node is stopping: nothing is renewed any more.
        self.heartbeats.clear();
    }

    /// Renews `chunk`; returns whether a renewal transaction committed.
    async fn renew_chunk(&self, chunk: Vec<Due>) -> bool {
        let started = Instant::now();
        match self.renew(&chunk).await {
            Ok(outcomes) => {
                self.settle(&chunk, outcomes, started);
                true
            }
            Err(e) if chunk.len() > 1 && may_be_one_workers(&e) => {
                let mut committed = false;
                for one in chunk {
                    let started = Instant::now();
                    let one = [one];
                    match self.renew(&one).await {
                        Ok(outcomes) => {
                            self.settle(&one, outcomes, started);
                            committed = true;
                        }
                        Err(e) => self.failed(&one, &e),
                    }
                }
                committed
            }
            Err(e) => {
                self.failed(&chunk, &e);
                false
            }
        }
    }

    /// One transaction run renewing `chunk`. Its writes of `health_vs`
    /// spare this handle's watches: the node's reaper, the one watcher of
    /// it here, hears of the renewal from `renewed` instead, in the same
    /// wake-up, without the store's watcher thread waking to fire it and
    /// waking the runtime again (bench/RESULTS.md: I1 with the node's own
    /// heartbeat watches spared, 2 Dec 2026).
    /// Other handles' watches (other nodes' reapers) fire as before.
    ///
    /// A reinstatement must reach its owner even when its commit landed
    /// but was answered `commit_unknown_result`: the retry finds the
    /// worker registered by that very write (`Renewed`). So an attempt
    /// that reinstates writes a receipt naming the registrations it
    /// reinstated (`store::receipt`; only on stores whose commits may be
    /// unknown, and only then: a plain renewal writes none), and a retry
    /// after an unknown commit reads it and answers those as reinstated.
    async fn renew(&self, chunk: &[Due]) -> Result<Vec<Option<Heartbeat>>, StoreError> {
        self.heartbeats.transactions.fetch_add(1, Ordering::Relaxed);
        let ks = &self.ctx.ks;
        run_retry_safe(self.ctx.db.as_ref(), self.ctx.write, ks, |tx, landed| async move {
            tx.spare_own_watches(&ks.health_vs());
            let landed = landed.map(|v| parse_indices(&v)).unwrap_or_default();
            let beats: Vec<Beat<'_>> =
                chunk.iter().map(|d| Beat { spec: &d.spec, incarnation: &d.incarnation }).collect();
            let mut outcomes =
                roster::heartbeat_many(&tx, ks, &beats, wall_clock_s(), |i| chunk[i].cancel.is_cancelled()).await?;
            let mut reinstated = landed.clone();
            for (i, outcome) in outcomes.iter_mut().enumerate() {
                match outcome {
                    // Registered again by the landed attempt: its owner
                    // has not been told yet.
                    Some(Heartbeat::Renewed) if landed.contains(&i) => *outcome = Some(Heartbeat::Reinstated),
                    Some(Heartbeat::Reinstated) if !landed.contains(&i) => reinstated.push(i),
                    _ => {}
                }
            }
            // A receipt only when this attempt reinstated more.
            let receipt = (reinstated.len() > landed.len()).then(|| encode_indices(&reinstated));
            Ok((outcomes, receipt))
        })
        .instrument(tracing::debug_span!(target: TARGET, "heartbeat", workers = chunk.len()))
        .await
        .map(|(outcomes, _)| outcomes)
    }

    /// Applies the outcomes of a committed renewal that began at `started`.
    fn settle(&self, chunk: &[Due], outcomes: Vec<Option<Heartbeat>>, started: Instant) {
        let mut recovered = Vec::new();
        let mut events = Vec::new();
        {
            let mut entries = self.heartbeats.lock();
            for (d, outcome) in chunk.iter().zip(outcomes) {
                let Some(entry) = entries.get_mut(&d.incarnation) else { continue };
                let p = period(entry.spec.timeout_s);
                entry.in_flight = false;
                match outcome {
                    // Ended by its owner meanwhile: its removal takes it out.
                    None => {}
                    Some(Heartbeat::Renewed) | Some(Heartbeat::Reinstated) => {
                        if entry.failures > 0 {
                            recovered.push((d.spec.clone(), entry.failures));
                        }
                        entry.failures = 0;
                        entry.open = started + p / 2;
                        entry.due = next_due(started, p);
                        if outcome == Some(Heartbeat::Reinstated) {
                            events.push((entry.events.clone(), OwnerEvent::Reaped, d.spec.clone()));
                        }
                    }
                    Some(Heartbeat::Gone) => {
                        events.push((entry.events.clone(), OwnerEvent::Superseded, d.spec.clone()));
                        entries.remove(&d.incarnation);
                    }
                }
            }
        }
        for (spec, failures) in recovered {
            let (t, id) = (spec.worker_type.as_slice(), spec.id.as_slice());
            log_event!(self.ctx.log, Notice, "heartbeat_recovered", "type" = t, id = id, failures = failures);
        }
        // Outside the lock: a listener may call back into the node.
        for (sink, event, spec) in events {
            let (t, id) = (spec.worker_type.as_slice(), spec.id.as_slice());
            match event {
                OwnerEvent::Reaped => log_event!(self.ctx.log, Warning, "worker_reinstated", "type" = t, id = id),
                OwnerEvent::Superseded => log_event!(self.ctx.log, Warning, "worker_superseded", "type" = t, id = id),
                _ => {}
            }
            sink.emit(event);
        }
    }

    /// A renewal of `chunk` failed: retry each sooner. Each worker's
    /// failure is its own event, as the per-type metrics and telemetry
    /// (`[couch_workers, heartbeat, failed]`) count them.
    fn failed(&self, chunk: &[Due], e: &StoreError) {
        let now = Instant::now();
        let mut failed = Vec::with_capacity(chunk.len());
        {
            let mut entries = self.heartbeats.lock();
            for d in chunk {
                let Some(entry) = entries.get_mut(&d.incarnation) else { continue };
                entry.in_flight = false;
                entry.failures += 1;
                entry.due = now + jittered(period(entry.spec.timeout_s) / 6, 0.5);
                entry.open = entry.due;
                failed.push((d.spec.clone(), entry.failures));
            }
        }
        for (spec, failures) in failed {
            let (t, id) = (spec.worker_type.as_slice(), spec.id.as_slice());
            log_event!(self.ctx.log, Warning, "heartbeat_failed", "type" = t, id = id, reason = %e, failures = failures);
        }
    }
}
