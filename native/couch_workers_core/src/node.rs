//! A node: one open store and the background services of one Erlang VM.
//!
//! `Node::start` opens the store, makes the node's [`Context`] and starts
//! the node's daemons (heartbeat, reaper, the job service's); registrations and
//! membership watches are handles whose drop stops their task (and, for a
//! registration, removes the worker), so that nothing outlives its owner.
//! `Node::stop` cancels every task at once and closes the store.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::error::Error;
use crate::keyspace::{Incarnation, Keyspace};
use crate::log::{Logger, Sink};
use crate::log_event;
use crate::services::heartbeat::{HeartbeatService, Heartbeats};
use crate::services::leadership::{LeaderSlot, Leaderships, OnLeaderEvent};
use crate::services::membership::{MembershipWatcher, OnMembership, OnMembershipUpdate};
use crate::services::owner_events::{OnOwnerEvent, OwnerEvents};
use crate::services::activity::{ActivityCounts, ActivityObserver};
use crate::services::reaper::Reaper;
use crate::roster;
use crate::schedules::runner::ScheduleRunner;
use crate::services::{wall_clock_s, TaskCounts};
use crate::tasks::supervise::ServiceKind;
use crate::tasks::Live;
use crate::store::receipt::{self, run_retry_safe};
use crate::store::{self, run, Db, StoreConfig, StoreError, Tx, TxOptions};
use crate::workers::{self, WorkerSpec};

/// Tunables, all with defaults an operator need not touch.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// The longest a changed health record waits for the reaper's next
    /// scan (after a change it scans at most this often; without one, as
    /// the liveness rule needs: `services/reaper.rs`).
    pub reaper_max_interval: Duration,
    /// Budget of one transaction run (all retries).
    pub tx_timeout: Duration,
    /// Most attempts of one transaction run.
    pub tx_retry_limit: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            reaper_max_interval: Duration::from_millis(500),
            tx_timeout: Duration::from_secs(5),
            tx_retry_limit: 100,
        }
    }
}

/// Counts of live things, for `couch_workers:stats/0` and leak tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub heartbeats: usize,
    pub watchers: usize,
    pub reapers: usize,
}

pub struct Node {
    /// The store, key space, logger, cancellation and task spawning every
    /// service of the node shares; `stop` cancels its token.
    ctx: Arc<Context>,
    counts: Arc<TaskCounts>,
    /// The job queue (its dispatchers, job watchers and orphan sweeper
    /// stop with the context's token).
    jobs: crate::jobs::JobService,
    /// The registrations the heartbeat service renews.
    heartbeats: Arc<Heartbeats>,
    /// The registrations' leadership slots and their types' watchers.
    leaderships: Arc<Leaderships>,
    /// What the activity observer did.
    activity: Arc<ActivityCounts>,
}

impl Node {
    /// Opens the store and starts the reaper. Must run on the runtime.
    pub async fn start(config: &StoreConfig, settings: Settings, sink: Arc<dyn Sink>) -> Result<Arc<Node>, Error> {
        let db = store::open(config).await?;
        let node = Node::with_db(db, settings, sink);
        let db = &node.ctx.db;
        log_event!(node.ctx.log, Notice, "store_opened", store = db.kind(), durability = %db.durability());
        Ok(node)
    }

    /// A node on an already open store (tests, benchmarks). Its events go
    /// to `sink`.
    pub fn with_db(db: Db, settings: Settings, sink: Arc<dyn Sink>) -> Arc<Node> {
        let tx = TxOptions { writes: true, timeout: settings.tx_timeout, retry_limit: settings.tx_retry_limit };
        let ctx = Context::new(db, Logger::new(sink), tx);
        let jobs = crate::jobs::JobService::start(&ctx);
        let node = Arc::new(Node {
            ctx: ctx.clone(),
            counts: Arc::new(TaskCounts::default()),
            jobs,
            heartbeats: Arc::new(Heartbeats::default()),
            leaderships: Arc::new(Leaderships::default()),
            activity: Arc::default(),
        });
        let cancel = ctx.cancel.child_token();
        let service =
            HeartbeatService { ctx: ctx.clone(), cancel: cancel.clone(), heartbeats: node.heartbeats.clone() };
        // Failing: every registration's owner is told (its worker may be
        // reaped).
        let heartbeats = node.heartbeats.clone();
        let on_failing = Box::new(move || heartbeats.tell_failing());
        ctx.spawn_supervised(
            ServiceKind::Heartbeat,
            Vec::new(),
            cancel,
            None,
            move || service.clone().run(),
            Some(on_failing),
        );
        let cancel = ctx.cancel.child_token();
        let runner = ScheduleRunner { ctx: ctx.clone(), cancel: cancel.clone() };
        ctx.spawn_supervised(ServiceKind::Schedules, Vec::new(), cancel, None, move || runner.clone().run(), None);
        let cancel = ctx.cancel.child_token();
        let reaper = Reaper {
            ctx: ctx.clone(),
            cancel: cancel.clone(),
            max_interval: settings.reaper_max_interval,
            own: node.heartbeats.clone(),
        };
        ctx.spawn_supervised(
            ServiceKind::Reaper,
            Vec::new(),
            cancel,
            Some(&node.counts.reapers),
            move || reaper.clone().run(),
            None,
        );
        let cancel = ctx.cancel.child_token();
        let observer = ActivityObserver {
            ctx: ctx.clone(),
            cancel: cancel.clone(),
            local: node.heartbeats.clone(),
            counts: node.activity.clone(),
        };
        ctx.spawn_supervised(ServiceKind::Activity, Vec::new(), cancel, None, move || observer.clone().run(), None);
        node
    }

    /// What this node's activity observer did (tests).
    #[cfg(feature = "internals")]
    pub fn activity_counts(&self) -> &ActivityCounts {
        &self.activity
    }

    /// This node's registrations as the activity observer sees them
    /// (tests that run observers of their own).
    #[cfg(feature = "internals")]
    pub fn local_workers(&self) -> Arc<dyn crate::services::activity::LocalWorkers> {
        self.heartbeats.clone()
    }

    /// Counts the job calls this node relays inside callers' transactions
    /// under `name` (stable across restarts: the Erlang node's name), and
    /// starts the watcher that reports them once committed
    /// (`jobs/tx_counts.rs`). Such calls run on FoundationDB only, so the
    /// NIF calls this on FoundationDB only (the tests on `sim` too). The
    /// baseline is read before this returns, so every call counted after
    /// it is reported; if that read fails, the watcher's first read is the
    /// baseline (logged). A second call changes nothing.
    pub async fn count_tx_calls(&self, name: &[u8]) {
        let ctx = &self.ctx;
        if ctx.tx_counts_name.get().is_some() {
            return;
        }
        let counts = crate::jobs::tx_counts::TxCounts::new(name);
        if let Err(e) = counts.baseline(ctx).await {
            log_event!(ctx.log, Warning, "tx_counts_baseline_failed", reason = %e);
        }
        if ctx.tx_counts_name.set(name.to_vec()).is_err() {
            return;
        }
        let cancel = ctx.cancel.child_token();
        let (task_ctx, task_cancel) = (ctx.clone(), cancel.clone());
        ctx.spawn_supervised(
            ServiceKind::TxCounts,
            Vec::new(),
            cancel,
            None,
            move || crate::jobs::tx_counts::watch_loop(task_ctx.clone(), counts.clone(), task_cancel.clone()),
            None,
        );
    }

    /// Makes the next `times` runs of a supervised task of `kind` panic
    /// (a running one at once): the restart tests' hook.
    #[cfg(feature = "testkit")]
    pub fn inject_panic(&self, kind: ServiceKind, times: u32) {
        self.ctx.supervisor.inject_panic(kind, times);
    }

    /// Stops every task, waits for them, and closes the store.
    pub async fn stop(&self) {
        self.ctx.stop_tasks().await;
        // A registration added while `stop` began has no service left.
        self.heartbeats.clear();
        self.ctx.db.close();
        log_event!(self.ctx.log, Notice, "store_closed", store = self.ctx.db.kind());
    }

    pub fn is_stopped(&self) -> bool {
        self.ctx.is_closed()
    }

    /// The node's context (the stateless calls run on it).
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub fn db(&self) -> &Db {
        &self.ctx.db
    }

    pub fn keyspace(&self) -> &Keyspace {
        &self.ctx.ks
    }

    pub fn logger(&self) -> &Logger {
        &self.ctx.log
    }

    pub fn runtime(&self) -> &Handle {
        self.ctx.runtime()
    }

    /// The job queue.
    pub fn jobs(&self) -> &crate::jobs::JobService {
        &self.jobs
    }

    pub fn stats(&self) -> Stats {
        Stats {
            heartbeats: self.counts.heartbeats.load(Ordering::SeqCst),
            watchers: self.counts.watchers.load(Ordering::SeqCst),
            reapers: self.counts.reapers.load(Ordering::SeqCst),
        }
    }

    /// Heartbeat transaction runs this node began (for the H1 benchmark and
    /// the tests that count them).
    pub fn heartbeat_transactions(&self) -> u64 {
        self.heartbeats.transactions()
    }

    pub fn read_options(&self) -> TxOptions {
        self.ctx.read
    }

    pub fn write_options(&self) -> TxOptions {
        self.ctx.write
    }

    /// Spawns a task that stops with the node.
    pub fn spawn<F>(&self, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.ctx.spawn(task);
    }

    // ---- workers --------------------------------------------------------

    /// Registers a worker, as a new incarnation, and hands it to the
    /// node's heartbeat service.
    /// The worker stays registered while the returned handle lives, unless
    /// a later registration of the same id (on any node) replaces it.
    pub async fn register_worker(self: &Arc<Self>, spec: WorkerSpec) -> Result<Registration, Error> {
        if self.is_stopped() {
            return Err(Error::Store(store::StoreError::Closed));
        }
        spec.validate(&self.ctx.ks)?;
        let incarnation = workers::new_incarnation();
        let ks = &self.ctx.ks;
        let (s, inc) = (&spec, &incarnation);
        let written = Instant::now();
        let replaced = self
            .run_failing_over(|tx| async move {
                roster::register_replacing(&tx, ks, s, inc, wall_clock_s()).await.map(Some)
            })
            .await?;
        self.log_requeued(&spec.worker_type, &spec.id, replaced, "replaced");
        if self.is_stopped() {
            // `stop` began while the write was in flight: no heartbeat will
            // run, so take the worker out again rather than leave it for a
            // reaper to find.
            let _ = self.remove_worker(&spec.worker_type, &spec.id, &incarnation, false).await;
            return Err(Error::Store(store::StoreError::Closed));
        }
        let spec = Arc::new(spec);
        let cancel = self.ctx.cancel.child_token();
        let events = Arc::new(OwnerEvents::default());
        let live = Live::new(&self.counts.heartbeats);
        self.heartbeats.add(spec.clone(), incarnation, cancel.clone(), events.clone(), written, live);
        let leadership = LeaderSlot::new(spec.id.clone(), incarnation);
        self.leaderships.add(&self.ctx, &spec.worker_type, leadership.clone());
        Ok(Registration {
            node: Arc::downgrade(self),
            spec,
            incarnation,
            cancel,
            removed: AtomicBool::new(false),
            events,
            leadership,
        })
    }

    /// Removes the worker of `reg` and stops its heartbeat; its running
    /// jobs go back to pending in the same transaction. Idempotent. A later
    /// registration of the same id is left alone, also when this runs long
    /// after it (a retry, the drop).
    pub async fn unregister_worker(&self, reg: &Registration) -> Result<(), Error> {
        self.end_registration(reg, false).await
    }

    /// As [`Node::unregister_worker`], for a registration whose owner died
    /// (its pid exited): a death, so its running jobs fail with
    /// `worker_lost` and spend an attempt (docs/api.md, "When a worker
    /// goes"), where an unregister
    /// releases them.
    pub async fn worker_died(&self, reg: &Registration) -> Result<(), Error> {
        self.end_registration(reg, true).await
    }

    async fn end_registration(&self, reg: &Registration, died: bool) -> Result<(), Error> {
        // Cancelled first: a renewal that reads the record after the
        // removal below sees the cancel and does not reinstate it.
        reg.cancel.cancel();
        self.heartbeats.remove(&reg.incarnation);
        if reg.removed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let result = self.remove_worker(&reg.spec.worker_type, &reg.spec.id, &reg.incarnation, died).await;
        if result.is_ok() {
            self.end_leadership(&reg.spec.worker_type, &reg.leadership);
        } else {
            // Let a later unregister (or the drop) try again.
            reg.removed.store(false, Ordering::SeqCst);
        }
        result
    }

    /// The registration is gone from the store: its owner loses a
    /// leadership it was told of, and the type's watcher forgets it.
    fn end_leadership(&self, worker_type: &[u8], slot: &Arc<LeaderSlot>) {
        self.leaderships.remove(worker_type, slot);
        slot.end();
    }

    async fn remove_worker(
        &self,
        worker_type: &[u8],
        id: &[u8],
        incarnation: &Incarnation,
        died: bool,
    ) -> Result<(), Error> {
        let ks = &self.ctx.ks;
        if died {
            let failed_over = self
                .run_failing_over(|tx| async move { roster::remove_dead(&tx, ks, worker_type, id, incarnation).await })
                .await?;
            self.log_requeued(worker_type, id, failed_over, "owner_exit");
        } else {
            // Released, not failed over: an unregister is no death.
            run(self.ctx.db.as_ref(), self.write_options(), |tx| async move {
                roster::remove(&tx, ks, worker_type, id, incarnation).await
            })
            .await?;
        }
        Ok(())
    }

    /// Runs a write that may fail jobs over (`Some(n)`: it wrote, and
    /// moved `n` jobs; `None`: it wrote nothing) and returns `n`, also when
    /// its commit landed but was answered `commit_unknown_result`: the
    /// attempt after it finds the write's receipt, with the count, where
    /// it would find only the write's effect (see `store::receipt`).
    async fn run_failing_over<F, Fut>(&self, body: F) -> Result<usize, StoreError>
    where
        F: Fn(Tx) -> Fut,
        Fut: std::future::Future<Output = Result<Option<usize>, StoreError>>,
    {
        let body = &body;
        let (moved, _) = run_retry_safe(self.ctx.db.as_ref(), self.ctx.write, &self.ctx.ks, |tx, landed| async move {
            if let Some(outcome) = landed {
                return Ok((receipt::parse_count(&outcome), None));
            }
            let moved = body(tx).await?;
            Ok((moved.unwrap_or(0), moved.map(receipt::count_outcome)))
        })
        .await?;
        Ok(moved)
    }

    /// `jobs` running jobs of a registration of this node's failed over
    /// (`reason`: `owner_exit`, its owner died; `replaced`, a new
    /// registration of its id took over from one that did not
    /// unregister): how the metrics' `jobs_requeued` learns of them, as it
    /// learns of a reap's from `worker_reaped`.
    fn log_requeued(&self, worker_type: &[u8], id: &[u8], jobs: usize, reason: &str) {
        if jobs > 0 {
            log_event!(
                self.ctx.log,
                Notice,
                "worker_jobs_requeued",
                "type" = worker_type,
                id = id,
                jobs = jobs,
                reason = reason
            );
        }
    }

    // ---- membership -----------------------------------------------------

    /// Starts a watcher of `worker_type`'s membership: `on_update` gets the
    /// current membership at once, then every change. Stops when the
    /// returned handle is dropped.
    pub fn watch_membership(&self, worker_type: Vec<u8>, on_update: OnMembership) -> Result<MembershipWatch, Error> {
        self.watch_membership_updates(worker_type, Box::new(move |update| on_update(update.to_membership())))
    }

    /// [`Node::watch_membership`] without the copy: `on_update` borrows the
    /// watcher's membership and gets the change since its last delivery
    /// when the watcher knows it (see `services::membership`).
    pub fn watch_membership_updates(
        &self,
        worker_type: Vec<u8>,
        on_update: OnMembershipUpdate,
    ) -> Result<MembershipWatch, Error> {
        if self.is_stopped() {
            return Err(Error::Store(store::StoreError::Closed));
        }
        crate::error::check_key(&self.ctx.ks.membership_vs(&worker_type))?;
        let cancel = self.ctx.cancel.child_token();
        let label = worker_type.clone();
        let watcher = MembershipWatcher {
            ctx: self.ctx.clone(),
            worker_type,
            on_update: Arc::new(on_update),
            known: Default::default(),
            cancel: cancel.clone(),
        };
        // Failing: logged (a membership delivery has no ended notice).
        self.ctx.spawn_supervised(
            ServiceKind::Membership,
            label,
            cancel.clone(),
            Some(&self.counts.watchers),
            move || watcher.clone().run(),
            None,
        );
        Ok(MembershipWatch { cancel })
    }
}

/// A live registration. Dropping it stops the heartbeat and removes the
/// worker (the owner is gone: its Erlang side was garbage collected).
/// While it lives its heartbeat tells the owner, through the listener set
/// with [`Registration::listen`], when it found the worker reaped (and
/// registered it again) or replaced by another registration.
pub struct Registration {
    node: std::sync::Weak<Node>,
    spec: Arc<WorkerSpec>,
    /// What every removal names, so that this handle never removes a
    /// later registration of the same id.
    incarnation: Incarnation,
    cancel: CancellationToken,
    removed: AtomicBool,
    /// What its heartbeat found that its owner must know.
    events: Arc<OwnerEvents>,
    /// Its leadership of its type, as its node's watcher reads it.
    leadership: Arc<LeaderSlot>,
}

impl Registration {
    /// Sets (or replaces) where this registration's owner events go (see
    /// `services::owner_events`); events that found no listener go to
    /// this one first. Returns whether the registration was superseded.
    pub fn listen(&self, listener: OnOwnerEvent) -> bool {
        self.events.listen(listener)
    }

    /// Sets (or replaces) where this registration's leadership events go
    /// (`services::leadership`): `Leader(Epoch)` when it becomes its
    /// type's leader (at once, if it leads and this owner was not told),
    /// `LeaderLost(Epoch)` when it stops.
    pub fn listen_leadership(&self, listener: OnLeaderEvent) {
        self.leadership.listen(listener);
    }

    /// The epoch it leads its type with, as its node last read it.
    pub fn leading(&self) -> Option<Vec<u8>> {
        self.leadership.leading()
    }

    /// Whether another registration of the same id replaced this one.
    pub fn is_superseded(&self) -> bool {
        self.events.is_superseded()
    }

    /// Removes the worker (see [`Node::unregister_worker`]); `Closed` if
    /// its node is gone.
    pub async fn unregister(&self) -> Result<(), Error> {
        match self.node.upgrade() {
            Some(node) => node.unregister_worker(self).await,
            None => {
                self.cancel.cancel();
                Err(Error::Store(store::StoreError::Closed))
            }
        }
    }

    pub fn spec(&self) -> &WorkerSpec {
        &self.spec
    }

    /// The incarnation stored in the worker's health record.
    pub fn incarnation(&self) -> &Incarnation {
        &self.incarnation
    }

    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::SeqCst)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.cancel.cancel();
        if self.removed.load(Ordering::SeqCst) {
            return;
        }
        let Some(node) = self.node.upgrade() else { return };
        node.heartbeats.remove(&self.incarnation);
        if node.is_stopped() {
            return;
        }
        let (spec, incarnation, slot) = (self.spec.clone(), self.incarnation, self.leadership.clone());
        let n = node.clone();
        node.spawn(async move {
            let removed = n.remove_worker(&spec.worker_type, &spec.id, &incarnation, false).await;
            if removed.is_ok() {
                n.end_leadership(&spec.worker_type, &slot);
            }
            if let Err(e) = removed {
                log_event!(
                    n.ctx.log,
                    Warning,
                    "worker_remove_failed",
                    "type" = spec.worker_type.as_slice(),
                    id = spec.id.as_slice(),
                    reason = %e
                );
            }
        });
    }
}

/// A live membership watcher; dropping it stops the watcher.
pub struct MembershipWatch {
    cancel: CancellationToken,
}

impl MembershipWatch {
    pub fn stop(&self) {
        self.cancel.cancel();
    }
}

impl Drop for MembershipWatch {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}
