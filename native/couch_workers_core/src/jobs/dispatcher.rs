//! The accept dispatcher: one per (node, job type) while acceptors wait.
//!
//! couch_jobs has every waiting acceptor hold its own watch on the type's
//! pending key and retry its own accept transaction when it fires: one
//! added job wakes every acceptor in the cluster (a thundering herd), all
//! of them race for it, all but one conflict and retry. To dodge the
//! conflicts it takes a *random* job among the first 1024 pending ones,
//! which gives up first-in-first-out order, and its accept loop restarts
//! the full timeout after each wake-up.
//!
//! Here a node has at most one waiting store watch per job type, whatever
//! the number of acceptors:
//!
//! * acceptors that wait (timeout > 0) join the dispatcher's FIFO of
//!   waiters (worker id, the incarnation it accepts for, deadline, reply);
//! * when a waiter arrives or the type's `jobs_vs` watch fires, the
//!   dispatcher runs one accept round ([`ops::accept`]): one transaction
//!   takes up to one job per waiter, in queue order, for up to
//!   [`ROUND_MAX_WAITERS`] waiters; if waiters are left, it reads
//!   `jobs_vs` as a snapshot and, after its commit, arms the watch in a
//!   read-only transaction that reads the key again: if it moved in
//!   between, another round follows at once, so no add slips between the
//!   round and the watch. Not in the round's own transaction: on
//!   FoundationDB creating a watch is a read with a conflict range, and
//!   every add writes `jobs_vs`, so each add would abort a round that
//!   took jobs (`tests/sim_accept_watch.rs`);
//! * while the rounds find jobs for every waiter they serve, the next round
//!   follows at once: waiters past the first [`ROUND_MAX_WAITERS`] are
//!   served from the jobs already pending, which fire no watch;
//! * scheduled jobs: each round also reads the earliest `run_at` of the
//!   type's scheduled jobs, and the dispatcher arms one timer for it (per
//!   node and type, on this node's wall clock). When it fires, a round
//!   takes the due jobs for its waiters straight from the scheduled keys
//!   (one transaction); then, after the deliveries, due jobs that no
//!   waiter took are moved to pending ([`ops::promote_due`]). A job scheduled earlier than every other bumps
//!   `jobs_vs`, so the round it causes re-arms the timer; no scan runs on
//!   a fixed interval. A job is never taken before its `run_at` by the
//!   clock of the node that moves it;
//! * while the type is paused (a flag every round reads), rounds take
//!   nothing and the watch stays armed: `job_resume/1` bumps `jobs_vs`,
//!   which wakes every node's dispatcher at once;
//! * at the handle's watch limit (`too_many_watches`) the dispatcher
//!   polls instead, with the growing pause of `tasks::watch_limit`
//!   (not a write round every 50 ms); arriving waiters are still served
//!   at once;
//! * a waiter whose deadline passes gets `not_found`; an accept with
//!   timeout 0 never comes here (one transaction, no dispatcher);
//! * while nothing happens the dispatcher sleeps on its watch, the timer
//!   of the earliest scheduled job and its waiters' deadlines, nothing
//!   else: a waiter's reply rings it when the acceptor goes away
//!   ([`AcceptReply::signal_gone`]), so no timer looks for gone waiters
//!   (one that cannot ring is looked at every [`PRUNE_INTERVAL`]);
//! * when no waiter is left the dispatcher exits (it is started again on
//!   demand), and it stops with the node (a child of the node's token),
//!   answering its waiters `store_closed`.
//!
//! Across nodes, dispatchers that take the same job conflict and one
//! retries: contention grows with the number of nodes, not of acceptors.
//! The retry starts at a random job a little down the queue (of the
//! head's priority; `ops::accept`'s `spread`), so that a node's round
//! cannot lose the head to the other nodes' until its budget ends (its
//! waiters would get `not_found` while jobs wait). Jobs keep their order
//! within that window. On one node, the round and the workers' own takes
//! (`job_finish_accept/3`, `job_accept/2` with timeout 0) claim the jobs
//! they take (`ops::Claims`) and pass over each other's: they share the
//! head instead of racing for it.
//!
//! A waiter that goes away must not lose a job. The dispatcher asks each
//! waiter whether it still waits ([`AcceptReply::is_waiting`]) right
//! before the round that could take a job for it, and skips it if not.
//! That cannot be airtight (it may go between the check and the commit),
//! so a delivery that fails ([`AcceptReply::deliver`] returns false)
//! releases the job: back to pending exactly as on failover, in its own
//! transaction, if that accept still holds it. A release the store fails
//! (a stall) is retried with backoff until it lands, in a task of its own
//! (`dispatcher::release`): the job
//! would otherwise stay running for a live worker that never got it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::commit::complete_handle_vs;
use super::job::{AcceptToken, Fence, JobHandle};
use super::ops::{self, Take};
use super::place::wall_ms;
use super::promoter::promote;
use crate::context::Context;
use crate::error::Error;
use crate::keyspace::Incarnation;
use crate::log::TARGET;
use crate::log_event;
use crate::store::{run, run_attempts, StoreError, Watch};
use crate::tasks::supervise::ServiceKind;
use crate::tasks::watch_limit::is_too_many_watches;
use crate::tasks::{jittered, sleep_or_cancel, Live};
use tracing::Instrument;

/// Most waiters served by one accept round (one transaction).
pub const ROUND_MAX_WAITERS: usize = 100;

/// How often waiters are checked for having gone away while nothing else
/// happens (so that a dispatcher whose acceptors all left stops watching),
/// while any waiter's reply cannot say so itself
/// ([`AcceptReply::signal_gone`]). With only replies that can, an idle
/// dispatcher has no timer but its waiters' deadlines.
const PRUNE_INTERVAL: Duration = Duration::from_secs(1);

/// Rung by a waiter's reply when its acceptor stops waiting (it gave up,
/// or died): the dispatcher wakes and drops it, with no timer to poll on.
/// A ring with no waiter gone costs one look at the waiters.
#[derive(Clone)]
pub struct GoneSignal(Arc<Notify>);

impl GoneSignal {
    /// Wakes the dispatcher (never blocks; a ring before it waits is kept).
    pub fn ring(&self) {
        self.0.notify_one();
    }
}

/// Where the outcome of an accept goes. The NIF implements it with a
/// message to the calling process; [`oneshot::Sender`] implements it for
/// Rust callers. Both methods are called on the runtime and must not
/// block.
pub trait AcceptReply: Send + 'static {
    /// Whether the acceptor still waits. Asked right before a job could be
    /// taken for it: a waiter that no longer waits is dropped unanswered.
    fn is_waiting(&self) -> bool {
        true
    }

    /// Called once, when the waiter joins a dispatcher: a reply that will
    /// ring `gone` as soon as [`AcceptReply::is_waiting`] turns false (and
    /// at once if it is false already) keeps it and returns true. The
    /// default returns false: the dispatcher then asks `is_waiting` every
    /// [`PRUNE_INTERVAL`] while it holds this waiter.
    fn signal_gone(&mut self, _gone: GoneSignal) -> bool {
        false
    }

    /// Delivers the outcome. Returns false if the acceptor is gone (the
    /// message could not be sent): a job it carried goes back to pending.
    fn deliver(self: Box<Self>, outcome: Result<JobHandle, Error>) -> bool;
}

impl AcceptReply for oneshot::Sender<Result<JobHandle, Error>> {
    fn is_waiting(&self) -> bool {
        !self.is_closed()
    }

    fn deliver(self: Box<Self>, outcome: Result<JobHandle, Error>) -> bool {
        (*self).send(outcome).is_ok()
    }
}

/// The reply of [`JobService::accept`](super::JobService::accept)'s future:
/// a oneshot sender that also rings the dispatcher when the future is
/// dropped unanswered ([`GoneGuard`]).
pub(crate) struct FutureReply {
    sender: oneshot::Sender<Result<JobHandle, Error>>,
    gone: Arc<Mutex<GoneState>>,
}

#[derive(Default)]
struct GoneState {
    gone: bool,
    signal: Option<GoneSignal>,
}

/// Held by the accept future: dropped before its answer came, it rings.
pub(crate) struct GoneGuard(Option<Arc<Mutex<GoneState>>>);

impl GoneGuard {
    /// The answer came: nothing to ring.
    pub fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for GoneGuard {
    fn drop(&mut self) {
        if let Some(state) = self.0.take() {
            let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
            st.gone = true;
            if let Some(signal) = &st.signal {
                signal.ring();
            }
        }
    }
}

/// A reply for a future and the guard the future holds.
pub(crate) fn future_reply() -> (FutureReply, GoneGuard, oneshot::Receiver<Result<JobHandle, Error>>) {
    let (sender, receiver) = oneshot::channel();
    let gone = Arc::new(Mutex::new(GoneState::default()));
    (FutureReply { sender, gone: gone.clone() }, GoneGuard(Some(gone)), receiver)
}

impl AcceptReply for FutureReply {
    fn is_waiting(&self) -> bool {
        !self.sender.is_closed()
    }

    fn signal_gone(&mut self, gone: GoneSignal) -> bool {
        let mut st = self.gone.lock().unwrap_or_else(|e| e.into_inner());
        if st.gone {
            gone.ring();
        }
        st.signal = Some(gone);
        true
    }

    fn deliver(self: Box<Self>, outcome: Result<JobHandle, Error>) -> bool {
        self.sender.send(outcome).is_ok()
    }
}

/// An [`AcceptReply`] from a closure that returns whether it delivered
/// (tests' acceptors).
#[cfg(feature = "internals")]
pub struct ReplyFn<F>(pub F);

#[cfg(feature = "internals")]
impl<F> AcceptReply for ReplyFn<F>
where
    F: FnOnce(Result<JobHandle, Error>) -> bool + Send + 'static,
{
    fn deliver(self: Box<Self>, outcome: Result<JobHandle, Error>) -> bool {
        (self.0)(outcome)
    }
}

/// One waiting acceptor.
pub(crate) struct Waiter {
    pub worker: Vec<u8>,
    /// The registration it accepts for (`None`: whichever holds `worker`):
    /// a waiter outlives the registration it was made for when that ends
    /// while it waits, and must then take nothing of the next one.
    pub incarnation: Option<Incarnation>,
    pub deadline: Instant,
    pub reply: Box<dyn AcceptReply>,
    /// Its reply rings the dispatcher's [`GoneSignal`] (set when it joins).
    pub signals: bool,
}

/// The live dispatchers of a node, by job type. Sending a waiter and a
/// dispatcher's decision to exit both happen under this lock, so a waiter
/// is never handed to a dispatcher that is leaving.
#[derive(Default)]
pub(crate) struct Dispatchers {
    map: Mutex<HashMap<Vec<u8>, Entry>>,
    next_id: AtomicU64,
    /// Waiters queued or held by dispatchers (stats).
    pub waiting: Arc<AtomicU64>,
    /// Dispatchers running (stats).
    pub live: Arc<std::sync::atomic::AtomicUsize>,
    /// The pending jobs the node's takes have in flight, every type: its
    /// rounds, `finish_accept` and accepts with timeout 0 pass over each
    /// other's ([`ops::Claims`]).
    pub claims: ops::Claims,
}

struct Entry {
    id: u64,
    sender: mpsc::UnboundedSender<Waiter>,
}

impl Dispatchers {
    /// Hands `waiter` to the type's dispatcher, starting one if none runs.
    pub fn submit(self: &Arc<Self>, shared: &Arc<Context>, job_type: &[u8], waiter: Waiter) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let waiter = match map.get(job_type) {
            Some(entry) => match entry.sender.send(waiter) {
                Ok(()) => return,
                // It exited without removing itself (a panic): replace it.
                Err(mpsc::error::SendError(waiter)) => waiter,
            },
            None => waiter,
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = mpsc::unbounded_channel();
        // The receiver is alive: this cannot fail.
        let _ = sender.send(waiter);
        map.insert(job_type.to_vec(), Entry { id, sender });
        // Supervised (`tasks/supervise.rs`): a run that panics parks its
        // queue in `home` (`Dispatcher`'s drop), where the next run takes
        // it up, so no waiter is lost; one that ends (no waiter left, or
        // the node stops) cancels `cancel`, and is not run again.
        let home = Arc::new(Mutex::new(Some(Parked { receiver, waiters: VecDeque::new() })));
        let cancel = shared.cancel.child_token();
        let gone = Arc::new(Notify::new());
        let (s, t, c, registry) = (shared.clone(), job_type.to_vec(), cancel.clone(), self.clone());
        shared.spawn_supervised(
            ServiceKind::Dispatcher,
            job_type.to_vec(),
            cancel,
            None,
            move || {
                let parked = home.lock().unwrap_or_else(|e| e.into_inner()).take();
                let dispatcher = parked.map(|parked| Dispatcher {
                    shared: s.clone(),
                    registry: registry.clone(),
                    job_type: t.clone(),
                    id,
                    receiver: parked.receiver,
                    cancel: c.clone(),
                    waiters: parked.waiters,
                    next_due: None,
                    paused: false,
                    gone: gone.clone(),
                    home: home.clone(),
                    in_round: Vec::new(),
                    round_tokens: Vec::new(),
                    ended: false,
                });
                let cancel = c.clone();
                async move {
                    match dispatcher {
                        Some(d) => d.run().await,
                        // Nothing parked: nothing to serve.
                        None => cancel.cancel(),
                    }
                }
            },
            None,
        );
    }
}

/// A dispatcher's queue between two runs.
struct Parked {
    receiver: mpsc::UnboundedReceiver<Waiter>,
    waiters: VecDeque<Waiter>,
}

enum Wake {
    Nothing,
    /// The timer of the earliest scheduled job fired.
    Due,
    Waiter(Waiter),
    Watch(Result<(), StoreError>),
}

/// Waits for the watch if there is one, forever if not.
async fn wait_armed(watch: &mut Option<Watch>) -> Result<(), StoreError> {
    match watch {
        Some(w) => w.await,
        None => std::future::pending().await,
    }
}

struct Dispatcher {
    shared: Arc<Context>,
    /// The node's dispatchers, this one among them.
    registry: Arc<Dispatchers>,
    job_type: Vec<u8>,
    id: u64,
    receiver: mpsc::UnboundedReceiver<Waiter>,
    cancel: CancellationToken,
    waiters: VecDeque<Waiter>,
    /// The earliest `run_at` of the type's scheduled jobs, as the last
    /// round saw it: the timer.
    next_due: Option<u64>,
    /// The type was paused at the last round.
    paused: bool,
    /// Rung by the replies of waiters that stop waiting.
    gone: Arc<Notify>,
    /// Where a run that panics leaves its queue for the next one.
    home: Arc<Mutex<Option<Parked>>>,
    /// The waiters of the round in flight, and the tokens it takes jobs
    /// under: a panic gives the jobs back and the waiters their place.
    in_round: Vec<Waiter>,
    round_tokens: Vec<(Vec<u8>, AcceptToken)>,
    /// Its run returned (rather than being dropped mid-way by a panic).
    ended: bool,
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        if self.ended {
            // No waiter left, or the node stops: not run again.
            self.cancel.cancel();
            return;
        }
        // A panic (or the task dropped with the runtime): the next run serves the same waiters, in the same
        // order; what the round in flight may have taken goes back.
        let tokens = std::mem::take(&mut self.round_tokens);
        if !tokens.is_empty() {
            reclaim(&self.shared, self.job_type.clone(), tokens);
        }
        let mut waiters: VecDeque<Waiter> = std::mem::take(&mut self.in_round).into();
        waiters.extend(self.waiters.drain(..));
        let (_, closed) = mpsc::unbounded_channel();
        let receiver = std::mem::replace(&mut self.receiver, closed);
        *self.home.lock().unwrap_or_else(|e| e.into_inner()) = Some(Parked { receiver, waiters });
    }
}

/// The monotonic instant at which this node's wall clock reads `at_ms`.
fn instant_of(at_ms: u64) -> Instant {
    let now = Instant::now();
    now.checked_add(Duration::from_millis(at_ms.saturating_sub(wall_ms())))
        .unwrap_or(now + Duration::from_secs(86_400 * 365))
}

impl Dispatcher {
    /// Whether scheduled jobs are due now (and may be taken).
    fn due(&self) -> bool {
        !self.paused && self.next_due.is_some_and(|t| t <= wall_ms())
    }

    /// Serves until no waiter is left or the node stops; then it is not
    /// run again. Dropped before that (a panic), it parks its queue.
    async fn run(mut self) {
        self.serve().await;
        self.ended = true;
    }

    async fn serve(&mut self) {
        let _live = Live::new(&self.registry.live);
        let mut watch: Option<Watch> = None;
        let mut need_round = true;
        let mut failures: u32 = 0;
        // Consecutive watches refused at the handle's limit, and the
        // earliest round that may try to arm one again.
        let mut at_limit: u32 = 0;
        let mut rearm_at: Option<Instant> = None;
        loop {
            if self.cancel.is_cancelled() {
                self.close();
                return;
            }
            while let Ok(w) = self.receiver.try_recv() {
                self.push(w);
                need_round = true;
            }
            self.prune();
            if self.waiters.is_empty() {
                if self.try_exit() {
                    return;
                }
                continue;
            }
            if need_round {
                // Acceptors tend to come together (the members of one
                // group commit get their outcome at once, and each then
                // accepts again): let the tasks already woken run first,
                // so that one round serves them all instead of one each.
                tokio::task::yield_now().await;
                while let Ok(w) = self.receiver.try_recv() {
                    self.push(w);
                }
                let span = tracing::debug_span!(target: TARGET, "accept_round", "type" = self.job_type.as_slice());
                match self.round().instrument(span).await {
                    Ok((more, w)) => {
                        failures = 0;
                        need_round = more;
                        watch = w;
                    }
                    Err(e) => {
                        failures += 1;
                        watch = None;
                        if matches!(e, StoreError::Closed) || self.cancel.is_cancelled() {
                            self.close();
                            return;
                        }
                        let t = self.job_type.as_slice();
                        log_event!(self.shared.log, Warning, "job_accept_round_failed", "type" = t, reason = %e, failures = failures);
                        let pause = jittered(Duration::from_millis(20u64 << failures.min(6)), 0.5);
                        if !sleep_or_cancel(pause, &self.cancel).await {
                            self.close();
                            return;
                        }
                    }
                }
                continue;
            }
            // Waiters and no watch, and not held off at the watch limit:
            // a round arms one. (A waiter taken over in `try_exit` comes
            // here with `need_round` unset; with no timer left to wake the
            // dispatcher it would wait to its deadline.)
            if watch.is_none() && rearm_at.is_none_or(|t| Instant::now() >= t) {
                rearm_at = None;
                need_round = true;
                continue;
            }
            let now = Instant::now();
            let mut wake = self.waiters.iter().map(|w| w.deadline).min().unwrap_or(now);
            if self.waiters.iter().any(|w| !w.signals) {
                wake = wake.min(now + PRUNE_INTERVAL);
            }
            let wake = rearm_at.map_or(wake, |t| wake.min(t));
            let timer = match self.next_due {
                Some(at) if !self.paused => instant_of(at),
                _ => now + Duration::from_secs(86_400),
            };
            let mut armed = watch.take();
            let (woke, why) = tokio::select! {
                _ = self.cancel.cancelled() => (Wake::Nothing, "cancelled"),
                w = self.receiver.recv() => (w.map_or(Wake::Nothing, Wake::Waiter), "waiter"),
                fired = wait_armed(&mut armed) => (Wake::Watch(fired), "watch"),
                // A waiter went away: the loop's prune drops it.
                _ = self.gone.notified() => (Wake::Nothing, "gone"),
                _ = tokio::time::sleep_until(timer) => (Wake::Due, "due"),
                _ = tokio::time::sleep_until(wake) => (Wake::Nothing, "timer"),
            };
            // For tests that count an idle dispatcher's wake-ups (off, and
            // free, unless a subscriber enables it).
            let _ = tracing::debug_span!(target: TARGET, "dispatcher_wake", why = why);
            match woke {
                Wake::Nothing => watch = armed,
                Wake::Due => {
                    watch = armed;
                    need_round = true;
                }
                Wake::Waiter(w) => {
                    watch = armed;
                    self.push(w);
                    need_round = true;
                }
                Wake::Watch(fired) => {
                    crate::stage::mark("dispatcher_woken");
                    need_round = true;
                    match fired {
                        Ok(()) => {
                            if at_limit > 0 {
                                at_limit = 0;
                                rearm_at = None;
                                self.shared.watch_limit.cleared();
                            }
                        }
                        Err(StoreError::Closed) => {}
                        Err(e) if is_too_many_watches(&e) => {
                            // The handle's limit: rather than a write round
                            // every 50 ms, poll with a growing pause (the
                            // node logs the episode once). Waiters that
                            // arrive are still served at once.
                            at_limit += 1;
                            let pause = self.shared.watch_limit.reached(at_limit);
                            let (t, delay_ms) = (self.job_type.as_slice(), pause.as_millis() as u64);
                            log_event!(
                                self.shared.log,
                                Debug,
                                "accept_watch_deferred",
                                "type" = t,
                                delay_ms = delay_ms
                            );
                            rearm_at = Some(Instant::now() + pause);
                            need_round = false;
                        }
                        Err(_) => {
                            // A failed watch: pause, then a round re-arms it.
                            let _ = sleep_or_cancel(Duration::from_millis(50), &self.cancel).await;
                        }
                    }
                }
            }
            // Waiters but no watch (the last round found none left, then
            // one came back, or the pause at the watch limit is over): a
            // round arms one.
            if watch.is_none() {
                match rearm_at {
                    Some(t) if Instant::now() < t => {}
                    _ => {
                        rearm_at = None;
                        need_round = true;
                    }
                }
            }
        }
    }

    fn push(&mut self, mut w: Waiter) {
        w.signals = w.reply.signal_gone(GoneSignal(self.gone.clone()));
        self.waiters.push_back(w);
    }

    /// Drops waiters that went away and answers expired ones `not_found`.
    fn prune(&mut self) {
        let now = Instant::now();
        let before = self.waiters.len();
        let mut kept = VecDeque::with_capacity(before);
        for w in self.waiters.drain(..) {
            if !w.reply.is_waiting() {
                continue;
            }
            if w.deadline <= now {
                let _ = w.reply.deliver(Err(Error::NotFound));
                continue;
            }
            kept.push_back(w);
        }
        self.registry.waiting.fetch_sub((before - kept.len()) as u64, Ordering::Relaxed);
        self.waiters = kept;
    }

    /// Answers every waiter `store_closed` (the node stops).
    fn close(&mut self) {
        let mut map = self.registry.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.get(&self.job_type).is_some_and(|e| e.id == self.id) {
            map.remove(&self.job_type);
        }
        drop(map);
        self.receiver.close();
        while let Ok(w) = self.receiver.try_recv() {
            self.waiters.push_back(w);
        }
        let n = self.waiters.len() as u64;
        for w in self.waiters.drain(..) {
            let _ = w.reply.deliver(Err(Error::Store(StoreError::Closed)));
        }
        self.registry.waiting.fetch_sub(n, Ordering::Relaxed);
    }

    /// Leaves if no waiter arrived meanwhile (decided under the registry
    /// lock, which every sender holds while sending).
    fn try_exit(&mut self) -> bool {
        let mut map = self.registry.map.lock().unwrap_or_else(|e| e.into_inner());
        match self.receiver.try_recv() {
            Ok(w) => {
                drop(map);
                self.push(w);
                false
            }
            Err(_) => {
                if map.get(&self.job_type).is_some_and(|e| e.id == self.id) {
                    map.remove(&self.job_type);
                }
                true
            }
        }
    }

    /// One accept round for the first waiters. Returns whether another
    /// round is due at once, and the watch armed for the waiters left.
    async fn round(&mut self) -> Result<(bool, Option<Watch>), StoreError> {
        let n = self.waiters.len().min(ROUND_MAX_WAITERS);
        self.in_round = self.waiters.drain(..n).collect();
        let workers: Vec<Vec<u8>> = self.in_round.iter().map(|w| w.worker.clone()).collect();
        let incarnations: Vec<Option<Incarnation>> = self.in_round.iter().map(|w| w.incarnation).collect();
        let rest = self.waiters.len();
        let tokens = ops::new_tokens(workers.len());
        self.round_tokens = workers.iter().cloned().zip(tokens.iter().copied()).collect();
        let shared = &self.shared;
        let ks = &shared.ks;
        let job_type = &self.job_type;
        let mut attempts = 0u32;
        let claimed = self.registry.claims.holder(job_type);
        let outcome = run_attempts(shared.db.as_ref(), shared.write, |tx, _| {
            attempts += 1;
            // The last attempt's claims: its commit is over.
            claimed.begin_attempt();
            let acceptors = ops::Acceptors {
                workers: &workers,
                incarnations: &incarnations,
                tokens: &tokens,
                recheck: attempts > 1,
                retries: attempts - 1,
                claims: Some(&claimed),
            };
            async move {
                let round = ops::accept(&tx, ks, job_type, acceptors).await?;
                let left = rest > 0 || round.takes.iter().any(|t| matches!(t, Take::NoJob));
                let seen = if left { Some(ops::pending_version(&tx, ks, job_type).await?) } else { None };
                Ok((round, seen))
            }
        })
        .await;
        drop(claimed);
        crate::stage::mark("round_committed");
        self.round_tokens.clear();
        let batch = std::mem::take(&mut self.in_round);
        let ((round, seen), info) = match outcome {
            Ok(done) => done,
            Err(e) => {
                // An attempt may have committed (`commit_unknown`, or cut
                // off in its commit): what it took under these tokens goes
                // back to pending. The batch waits on, in front, and the
                // next round draws new tokens.
                if !matches!(e, StoreError::Closed) {
                    reclaim(shared, job_type.clone(), workers.into_iter().zip(tokens).collect());
                }
                for w in batch.into_iter().rev() {
                    self.waiters.push_front(w);
                }
                return Err(e);
            }
        };
        // A batch with no waiter left over may have stopped short of the
        // pending jobs only because it was full: the waiters behind it are
        // due a round now, since no watch fires for jobs already pending.
        let batch_drained = !round.takes.iter().any(|t| matches!(t, Take::NoJob));
        log_unrunnable(&self.shared, job_type, &round.unrunnable);
        self.next_due = round.next_due;
        self.paused = round.paused;
        let again = round.more || (rest > 0 && batch_drained);
        let mut left = Vec::new();
        let mut answered = 0u64;
        for (waiter, take) in batch.into_iter().zip(round.takes) {
            match take {
                Take::NoJob => left.push(waiter),
                Take::NotRegistered => {
                    answered += 1;
                    let _ = waiter.reply.deliver(Err(Error::NotFound));
                }
                Take::Job(mut handle) => {
                    answered += 1;
                    match complete_handle_vs(&mut handle, &info) {
                        Ok(()) => {}
                        Err(e) => {
                            // Cannot happen (the round wrote versionstamped
                            // values); give the job back rather than hand
                            // out a handle without a valid vs.
                            let _ = waiter.reply.deliver(Err(Error::Store(e)));
                            release(&self.shared, handle).await;
                            continue;
                        }
                    }
                    let fallback = handle.clone();
                    if !waiter.reply.deliver(Ok(handle)) {
                        release(&self.shared, fallback).await;
                    }
                }
            }
        }
        self.registry.waiting.fetch_sub(answered, Ordering::Relaxed);
        for w in left.into_iter().rev() {
            self.waiters.push_front(w);
        }
        if self.due() {
            // After the deliveries: jobs that fell due and that no waiter
            // took (more than the waiters, or stale keys) move to pending,
            // so that counts and later accepts find them there, and the
            // timer is re-armed for what is left.
            self.next_due = promote(&self.shared, &self.job_type).await?;
        }
        let Some(seen) = seen else { return Ok((again, None)) };
        // The watch for the waiters left, armed now in a read-only
        // transaction (not in the round's: see `ops::pending_watch`). A
        // job that became pending since the round's read either moved
        // `jobs_vs` before this read (then it differs from what the round
        // saw: another round at once) or fires the watch.
        let (now, watch) =
            run(shared.db.as_ref(), shared.read, |tx| async move { ops::pending_watch(&tx, ks, job_type).await })
                .await?;
        if now != seen {
            return Ok((true, None));
        }
        Ok((again, Some(watch)))
    }
}

/// An accept round failed after an attempt that may have committed:
/// gives back, in a task of its own, the jobs it may have taken under
/// `taken`'s tokens (nobody holds those handles), retrying with
/// backoff until it succeeds or the node stops ([`ops::reclaim`]).
/// Its own task: the caller answers at once, and the store that made
/// the round fail may need a while to recover.
pub(crate) fn reclaim(ctx: &Arc<Context>, job_type: Vec<u8>, taken: Vec<(Vec<u8>, AcceptToken)>) {
    if taken.is_empty() || ctx.cancel.is_cancelled() {
        return;
    }
    let shared = ctx.clone();
    ctx.spawn(async move {
        let ks = &shared.ks;
        let (t, j) = (&taken, &job_type);
        for failures in 0u32.. {
            let given =
                run(shared.db.as_ref(), shared.write, |tx| async move { ops::reclaim(&tx, ks, j, t).await }).await;
            match given {
                Ok(n) => {
                    if n > 0 {
                        log_event!(shared.log, Info, "job_accept_reclaimed", "type" = j.as_slice(), count = n);
                    }
                    return;
                }
                Err(e) => {
                    log_event!(shared.log, Warning, "job_accept_reclaim_failed", "type" = j.as_slice(), reason = %e);
                    if matches!(e, StoreError::Closed)
                        || !sleep_or_cancel(
                            jittered(Duration::from_millis(50u64 << failures.min(6)), 0.5),
                            &shared.cancel,
                        )
                        .await
                    {
                        return;
                    }
                }
            }
        }
    });
}

/// Gives back a job whose delivery failed (see the module comment).
/// The first try runs here; if the store fails it (a stall longer
/// than the call's budget, say), the give-back is retried with
/// backoff in a task of its own until it lands: left undone, the job
/// would stay running for a live worker that never heard of it, and
/// no failover would ever end it. Each failure is logged; a give-back
/// the node's stop cuts short is logged as abandoned (the job then
/// stays with its worker until the worker leaves).
pub(crate) async fn release(ctx: &Arc<Context>, handle: JobHandle) {
    let fence = handle.fence();
    if give_back_once(ctx, &fence, 1).await {
        return;
    }
    let shared = ctx.clone();
    ctx.spawn(async move {
        for failures in 1u32.. {
            let pause = jittered(Duration::from_millis(50u64 << failures.min(6)), 0.5);
            if !sleep_or_cancel(pause, &shared.cancel).await {
                let (t, id, worker) = (fence.job_type.as_slice(), fence.job_id.as_slice(), fence.worker.as_slice());
                log_event!(
                    shared.log,
                    Error,
                    "job_release_abandoned",
                    "type" = t,
                    id = id,
                    worker = worker,
                    reason = "node_stopped",
                    failures = failures
                );
                return;
            }
            if give_back_once(&shared, &fence, failures + 1).await {
                return;
            }
        }
    });
}

/// One transaction of [`release`]: true once the give-back is
/// settled (done, or nothing left to give back: the accept no longer
/// holds the job, or the store is closed), false if it must be tried
/// again.
async fn give_back_once(ctx: &Context, fence: &Fence, attempt: u32) -> bool {
    let ks = &ctx.ks;
    let released = run(ctx.db.as_ref(), ctx.write, |tx| async move { ops::give_back(&tx, ks, fence).await }).await;
    let (t, id, worker) = (fence.job_type.as_slice(), fence.job_id.as_slice(), fence.worker.as_slice());
    match released {
        Ok(true) => {
            log_event!(ctx.log, Info, "job_released", "type" = t, id = id, worker = worker);
            true
        }
        Ok(false) => true,
        Err(e) => {
            let closed = matches!(e, StoreError::Closed);
            log_event!(
                ctx.log,
                Warning,
                "job_release_failed",
                "type" = t,
                id = id,
                worker = worker,
                reason = %e,
                failures = attempt,
                retry = !closed
            );
            closed
        }
    }
}

/// Logs each job an accept round failed because no worker can hold it
/// (`ops::accept`): the one word of it besides its error.
pub(crate) fn log_unrunnable(ctx: &Context, job_type: &[u8], ids: &[Vec<u8>]) {
    for id in ids {
        log_event!(
            ctx.log,
            Error,
            "job_failed_unrunnable",
            "type" = job_type,
            id = id.as_slice(),
            reason = "value_too_large"
        );
    }
}
