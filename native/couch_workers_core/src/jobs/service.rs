//! The node's job service: the stateless job API ([`Jobs`], which it
//! derefs to) plus the calls that need the node's running tasks, and the
//! job daemons a node runs. Only a node starts one ([`JobService::start`]):
//! the sweeper, the pruner and the promoter run while the node runs; accept
//! dispatchers and job watchers while someone waits or subscribes.
//!
//! `accept` may wait: [`JobService::accept_with`] never blocks and
//! delivers its one outcome through an [`AcceptReply`] (the NIF's sends a
//! message and reports whether the process was alive);
//! [`JobService::accept`] is the same as a future. `subscribe` returns the
//! current job and a [`JobSubscription`] whose callback gets each change.

use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::api::Jobs;
use super::dispatcher::{future_reply, release, AcceptReply, Dispatchers, Waiter};
use super::finish_next::{finish_accept, NextFor};
use super::job::{Fence, Job, JobHandle};
use super::promoter::run_promoter;
use super::pruner::run_pruner;
use super::subscription::{read_current, JobSubscription, OnJobEvent, Watchers};
use super::sweeper::run_sweeper;
use super::take::accept_now;
use crate::context::Context;
use crate::error::{check_key, Error};
use crate::keyspace::Incarnation;
use crate::tasks::supervise::ServiceKind;
use crate::store::StoreError;

/// Counts of the service's live tasks and waiters (leak tests, stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JobStats {
    /// Accept dispatchers running (at most one per job type).
    pub dispatchers: usize,
    /// Acceptors waiting in dispatchers.
    pub waiters: u64,
    /// Job watchers running (one per subscribed job).
    pub job_watchers: usize,
    /// Orphan sweepers running (one while the node runs).
    pub sweepers: usize,
    /// Pruners running (one while the node runs).
    pub pruners: usize,
}

/// What the service's running calls share.
struct Running {
    ctx: Arc<Context>,
    dispatchers: Arc<Dispatchers>,
    watchers: Arc<Watchers>,
    sweepers: Arc<AtomicUsize>,
    pruners: Arc<AtomicUsize>,
}

/// The job queue of one node. Cheap to clone.
#[derive(Clone)]
pub struct JobService {
    jobs: Jobs,
    running: Arc<Running>,
}

/// The stateless calls (add, get, cancel, finish, ...): a node's service
/// answers them as [`Jobs`] on the same context does.
impl Deref for JobService {
    type Target = Jobs;

    fn deref(&self) -> &Jobs {
        &self.jobs
    }
}

impl JobService {
    /// Starts the node's job daemons on `ctx` (the sweeper, pruner and
    /// promoter; they stop when its token is cancelled).
    pub(crate) fn start(ctx: &Arc<Context>) -> JobService {
        let running = Arc::new(Running {
            ctx: ctx.clone(),
            dispatchers: Arc::default(),
            watchers: Arc::default(),
            sweepers: Arc::default(),
            pruners: Arc::default(),
        });
        let (c, cancel) = (ctx.clone(), ctx.cancel.child_token());
        let t = cancel.clone();
        ctx.spawn_supervised(
            ServiceKind::Sweeper,
            Vec::new(),
            cancel,
            Some(&running.sweepers),
            move || run_sweeper(c.clone(), t.clone()),
            None,
        );
        let (c, cancel) = (ctx.clone(), ctx.cancel.child_token());
        let t = cancel.clone();
        ctx.spawn_supervised(
            ServiceKind::Pruner,
            Vec::new(),
            cancel,
            Some(&running.pruners),
            move || run_pruner(c.clone(), t.clone()),
            None,
        );
        let (c, cancel) = (ctx.clone(), ctx.cancel.child_token());
        let t = cancel.clone();
        ctx.spawn_supervised(
            ServiceKind::Promoter,
            Vec::new(),
            cancel,
            None,
            move || run_promoter(c.clone(), t.clone()),
            None,
        );
        JobService { jobs: Jobs::new(ctx.clone()), running }
    }

    pub fn stats(&self) -> JobStats {
        let r = &self.running;
        JobStats {
            dispatchers: r.dispatchers.live.load(Ordering::SeqCst),
            waiters: r.dispatchers.waiting.load(Ordering::SeqCst),
            job_watchers: r.watchers.live.load(Ordering::SeqCst),
            sweepers: r.sweepers.load(Ordering::SeqCst),
            pruners: r.pruners.load(Ordering::SeqCst),
        }
    }

    /// Takes the next pending job of `worker_type` for the registered
    /// worker `worker`, waiting up to `timeout` for one (zero: one
    /// transaction, no wait). Never blocks: the outcome (a handle, or
    /// `not_found` when the worker is not registered or no job came in
    /// time) goes to `reply` exactly once, unless the reply says it no
    /// longer waits. If the delivery of a job fails, the job goes back to
    /// pending.
    pub fn accept_with(&self, worker_type: Vec<u8>, worker: Vec<u8>, timeout: Duration, reply: Box<dyn AcceptReply>) {
        self.accept_registered_with(worker_type, worker, None, timeout, reply)
    }

    /// [`JobService::accept_with`] for one registration of `worker`: with
    /// `Some(incarnation)`, a job is taken only while that incarnation
    /// holds the id (the outcome is `not_found` once it no longer does,
    /// also when the id is registered again while the acceptor waits).
    pub fn accept_registered_with(
        &self,
        worker_type: Vec<u8>,
        worker: Vec<u8>,
        incarnation: Option<Incarnation>,
        timeout: Duration,
        reply: Box<dyn AcceptReply>,
    ) {
        let ctx = &self.running.ctx;
        if let Err(e) = ctx.check_open().and_then(|()| check_key(&ctx.ks.member(&worker_type, &worker))) {
            let _ = reply.deliver(Err(e));
            return;
        }
        if timeout.is_zero() {
            let c = ctx.clone();
            let registry = self.running.dispatchers.clone();
            ctx.spawn(async move {
                let outcome = accept_now(&c, &worker_type, &worker, incarnation, &registry.claims).await;
                let taken = outcome.as_ref().ok().cloned();
                if !reply.deliver(outcome) {
                    if let Some(handle) = taken {
                        release(&c, handle).await;
                    }
                }
            });
            return;
        }
        let now = Instant::now();
        let deadline = now.checked_add(timeout).unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400));
        let dispatchers = &self.running.dispatchers;
        dispatchers.waiting.fetch_add(1, Ordering::Relaxed);
        dispatchers.submit(ctx, &worker_type, Waiter { worker, incarnation, deadline, reply, signals: false });
    }

    /// [`JobService::accept_with`] as a future. Dropping the future before
    /// it resolves withdraws the acceptor (a job taken for it meanwhile
    /// goes back to pending).
    pub async fn accept(&self, worker_type: &[u8], worker: &[u8], timeout: Duration) -> Result<JobHandle, Error> {
        self.accept_registered(worker_type, worker, None, timeout).await
    }

    /// [`JobService::accept_registered_with`] as a future.
    pub async fn accept_registered(
        &self,
        worker_type: &[u8],
        worker: &[u8],
        incarnation: Option<Incarnation>,
        timeout: Duration,
    ) -> Result<JobHandle, Error> {
        if timeout.is_zero() {
            let ctx = &self.running.ctx;
            ctx.check_open()?;
            check_key(&ctx.ks.member(worker_type, worker))?;
            return accept_now(ctx, worker_type, worker, incarnation, &self.running.dispatchers.claims).await;
        }
        let (reply, guard, receiver) = future_reply();
        self.accept_registered_with(worker_type.to_vec(), worker.to_vec(), incarnation, timeout, Box::new(reply));
        let outcome = receiver.await.unwrap_or(Err(Error::Store(StoreError::Closed)));
        guard.disarm();
        outcome
    }

    /// Finishes the job the fence's accept holds and, in the same
    /// transaction, takes the next pending job for `next` (see
    /// `finish_next.rs`): `Ok(None)` when the finish committed and no job
    /// was taken. A taken job whose delivery fails goes back with
    /// [`JobService::give_back`].
    pub async fn finish_accept(
        &self,
        fence: &Fence,
        result: &[u8],
        next: NextFor<'_>,
    ) -> Result<Option<JobHandle>, Error> {
        let ctx = &self.running.ctx;
        ctx.check_open()?;
        check_key(&ctx.ks.member(next.worker_type, next.worker))?;
        finish_accept(ctx, fence, result, next, &self.running.dispatchers.claims).await
    }

    /// Gives back a job taken for a caller that no longer waits for it
    /// (its delivery failed): pending again, if that accept still holds it.
    pub async fn give_back(&self, handle: JobHandle) {
        release(&self.running.ctx, handle).await
    }

    /// The current job, and a subscription whose `on_event` gets every
    /// later change (`Changed` with a greater `vs` each time; `Removed`
    /// once, which ends it). `not_found` if the job does not exist.
    pub async fn subscribe(
        &self,
        job_type: &[u8],
        id: &[u8],
        on_event: OnJobEvent,
    ) -> Result<(Job, JobSubscription), Error> {
        let ctx = &self.running.ctx;
        ctx.check_open()?;
        let current = read_current(ctx, job_type, id).await?;
        Ok(self.running.watchers.subscribe(ctx, current, on_event))
    }
}
