//! The node's job service: the API the NIF calls.
//!
//! Every call that returns has committed its write. Calls that only need
//! one transaction are `async fn`s (the NIF runs them on the runtime and
//! answers with a message). `accept` may wait: [`JobService::accept_with`]
//! never blocks and delivers its one outcome through an [`AcceptReply`]
//! (the NIF's sends a message and reports whether the process was alive);
//! [`JobService::accept`] is the same as a future. `subscribe` returns the
//! current job and a [`JobSubscription`] whose callback gets each change.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::commit::{complete_handle_vs, run_committed, run_once};
use super::dispatcher::{future_reply, AcceptReply, Dispatchers, Waiter};
use super::finish_next::NextFor;
use super::job::{AddManyError, Fence, Job, JobHandle, JobOpts, JobSpec, JobState, JobVs, NewJob};
use super::ops::{self, Retry, RunEnd, Take};
use super::place::wall_ms;
use super::promoter::run_promoter;
use super::pruner::run_pruner;
use super::receipt::{self, Receipt};
use super::subscription::{read_current, JobSubscription, OnJobEvent, Watchers};
use super::sweeper::run_sweeper;
use crate::error::{check_key, Error};
use crate::keyspace::{Incarnation, Keyspace};
use crate::log::Logger;
use crate::log_event;
use crate::services::supervise::{ServiceKind, Supervisor};
use crate::services::watch_limit::WatchLimit;
use crate::store::run_attempts;
use crate::store::{run, Db, StoreError, TxOptions};

/// Most rounds an accept with timeout 0 runs when a round cleared stale
/// pending keys instead of finding a job.
const ACCEPT_NOW_ROUNDS: usize = 8;

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

#[derive(Default)]
pub(crate) struct JobCounts {
    pub dispatchers: Arc<AtomicUsize>,
    pub job_watchers: Arc<AtomicUsize>,
    pub sweepers: Arc<AtomicUsize>,
    pub pruners: Arc<AtomicUsize>,
    pub promoters: Arc<AtomicUsize>,
}

pub(crate) use crate::services::Live;

/// What the service's tasks share.
pub(crate) struct ServiceState {
    pub db: Db,
    pub ks: Keyspace,
    pub log: Logger,
    pub read: TxOptions,
    pub write: TxOptions,
    /// A child of the node's token: cancelled when the node stops.
    pub cancel: CancellationToken,
    tasks: TaskTracker,
    runtime: Handle,
    pub counts: JobCounts,
    pub dispatchers: Dispatchers,
    pub watchers: Watchers,
    /// The database handle's watch-limit episode, shared with the node's
    /// membership watchers: the limit is the handle's.
    pub watch_limit: Arc<WatchLimit>,
    /// Restarts the service's long-lived tasks (the node's supervisor).
    pub supervisor: Arc<Supervisor>,
}

impl ServiceState {
    /// Spawns a supervised task of `kind` (see `services::supervise`),
    /// counted live in `count` for as long as it is supervised.
    pub(crate) fn spawn_supervised<F, Fut>(
        &self,
        kind: ServiceKind,
        label: Vec<u8>,
        cancel: CancellationToken,
        count: Option<&Arc<AtomicUsize>>,
        factory: F,
    ) where
        F: Fn() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let live = count.map(Live::new);
        let supervised = self.supervisor.supervise(kind, label, cancel, factory, None);
        self.spawn(async move {
            let _live = live;
            supervised.await
        });
    }

    pub fn spawn<F>(&self, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn_on(task, &self.runtime);
    }

    fn check_open(&self) -> Result<(), Error> {
        if self.cancel.is_cancelled() {
            Err(Error::Store(StoreError::Closed))
        } else {
            Ok(())
        }
    }

    /// One accept transaction for one worker (for `incarnation` only, if
    /// given), no waiting.
    pub(crate) async fn accept_now(
        self: &Arc<Self>,
        worker_type: &[u8],
        worker: &[u8],
        incarnation: Option<Incarnation>,
    ) -> Result<JobHandle, Error> {
        let workers = vec![worker.to_vec()];
        let incarnations = [incarnation];
        let ks = &self.ks;
        for _ in 0..ACCEPT_NOW_ROUNDS {
            let tokens = ops::new_tokens(1);
            let mut attempts = 0u32;
            let claimed = self.dispatchers.claims.holder(worker_type);
            let outcome = run_committed(self.db.as_ref(), self.write, |tx| {
                attempts += 1;
                claimed.begin_attempt();
                let acceptors = ops::Acceptors {
                    workers: &workers,
                    incarnations: &incarnations,
                    tokens: &tokens,
                    recheck: attempts > 1,
                    retries: attempts - 1,
                    claims: Some(&claimed),
                };
                async move { ops::accept(&tx, ks, worker_type, acceptors).await }
            })
            .await;
            let (round, info) = match outcome {
                Ok(done) => done,
                Err(e) => {
                    // The call answers the error; a job an attempt may
                    // have taken goes back to pending (nobody holds it).
                    if !matches!(e, StoreError::Closed) {
                        self.reclaim(worker_type.to_vec(), vec![(worker.to_vec(), tokens[0])]);
                    }
                    return Err(e.into());
                }
            };
            self.log_unrunnable(worker_type, &round.unrunnable);
            let more = round.more;
            let due = round.next_due.is_some_and(|t| t <= wall_ms()) && !round.paused;
            match round.takes.into_iter().next() {
                Some(Take::Job(mut handle)) => {
                    complete_handle_vs(&mut handle, &info)?;
                    return Ok(handle);
                }
                Some(Take::NoJob) if due => {
                    self.promote(worker_type).await?;
                    continue;
                }
                Some(Take::NoJob) if more => continue,
                _ => return Err(Error::NotFound),
            }
        }
        Err(Error::NotFound)
    }
}

impl ServiceState {
    /// Logs each job an accept round failed because no worker can hold
    /// it (`ops::accept`): the one word of it besides its error.
    pub(crate) fn log_unrunnable(&self, job_type: &[u8], ids: &[Vec<u8>]) {
        for id in ids {
            log_event!(
                self.log,
                Error,
                "job_failed_unrunnable",
                "type" = job_type,
                id = id.as_slice(),
                reason = "value_too_large"
            );
        }
    }

    /// Moves the type's due scheduled jobs to pending (bounded batches),
    /// by this node's wall clock. Returns the earliest `run_at` left.
    pub(crate) async fn promote(&self, job_type: &[u8]) -> Result<Option<u64>, StoreError> {
        let ks = &self.ks;
        loop {
            let now = wall_ms();
            let (moved, next) = run(self.db.as_ref(), self.write, |tx| async move {
                ops::promote_due(&tx, ks, job_type, now, PROMOTE_BATCH).await
            })
            .await?;
            if moved < PROMOTE_BATCH || next.is_some_and(|t| t > now) {
                return Ok(next);
            }
        }
    }
}

/// Most scheduled jobs one transaction moves to pending.
const PROMOTE_BATCH: usize = 500;

/// The job queue of one node. Cheap to clone.
#[derive(Clone)]
pub struct JobService {
    shared: Arc<ServiceState>,
}

impl JobService {
    /// Starts the service on the runtime `runtime` (its orphan sweeper);
    /// `cancel` stops every task of it; `tasks` tracks them (the node
    /// waits for them when it stops).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        db: Db,
        ks: Keyspace,
        log: Logger,
        read: TxOptions,
        write: TxOptions,
        cancel: CancellationToken,
        tasks: TaskTracker,
        runtime: Handle,
    ) -> JobService {
        let watch_limit = Arc::new(WatchLimit::new(log.clone()));
        let supervisor = Supervisor::new(log.clone());
        let shared = Arc::new(ServiceState {
            db,
            ks,
            log,
            read: TxOptions { writes: false, ..read },
            write: TxOptions { writes: true, ..write },
            cancel,
            tasks,
            runtime,
            counts: JobCounts::default(),
            dispatchers: Dispatchers::default(),
            watchers: Watchers::default(),
            watch_limit,
            supervisor,
        });
        let (s, cancel) = (shared.clone(), shared.cancel.child_token());
        let c = cancel.clone();
        shared.spawn_supervised(ServiceKind::Sweeper, Vec::new(), cancel, Some(&shared.counts.sweepers), move || {
            run_sweeper(s.clone(), c.clone())
        });
        let (s, cancel) = (shared.clone(), shared.cancel.child_token());
        let c = cancel.clone();
        shared.spawn_supervised(ServiceKind::Pruner, Vec::new(), cancel, Some(&shared.counts.pruners), move || {
            run_pruner(s.clone(), c.clone())
        });
        let (s, cancel) = (shared.clone(), shared.cancel.child_token());
        let c = cancel.clone();
        shared.spawn_supervised(ServiceKind::Promoter, Vec::new(), cancel, Some(&shared.counts.promoters), move || {
            run_promoter(s.clone(), c.clone())
        });
        JobService { shared }
    }

    /// The node's supervisor (its tasks and the service's share it).
    pub(crate) fn supervisor(&self) -> Arc<Supervisor> {
        self.shared.supervisor.clone()
    }

    /// The watch-limit episode of the service's database handle (the
    /// node's membership watchers share it).
    pub(crate) fn watch_limit(&self) -> Arc<WatchLimit> {
        self.shared.watch_limit.clone()
    }

    pub fn stats(&self) -> JobStats {
        let s = &self.shared;
        JobStats {
            dispatchers: s.counts.dispatchers.load(Ordering::SeqCst),
            waiters: s.dispatchers.waiting.load(Ordering::SeqCst),
            job_watchers: s.counts.job_watchers.load(Ordering::SeqCst),
            sweepers: s.counts.sweepers.load(Ordering::SeqCst),
            pruners: s.counts.pruners.load(Ordering::SeqCst),
        }
    }

    /// Adds a pending job: `AlreadyExists` if the id exists in any state.
    pub async fn add(&self, job_type: &[u8], id: &[u8], info: &[u8], priority: i64) -> Result<(), Error> {
        self.shared.check_open()?;
        let job = NewJob { id: id.to_vec(), info: info.to_vec(), priority };
        let ks = &self.shared.ks;
        let j = &job;
        run_once(
            self.shared.db.as_ref(),
            self.shared.write,
            ks,
            |tx| async move { ops::add(&tx, ks, job_type, j).await },
        )
        .await?
    }

    /// Adds a job with its options (`job_add/4`): scheduled, or pending at
    /// once; `AlreadyExists` if the id exists in any state.
    pub async fn add_with(&self, job_type: &[u8], id: &[u8], info: &[u8], opts: &JobOpts) -> Result<(), Error> {
        self.shared.check_open()?;
        let job = JobSpec { id: id.to_vec(), info: info.to_vec(), opts: *opts };
        let ks = &self.shared.ks;
        let j = &job;
        crate::stage::mark("add_task_runs");
        let added = run_once(self.shared.db.as_ref(), self.shared.write, ks, |tx| async move {
            ops::add_job(&tx, ks, job_type, j, wall_ms()).await
        })
        .await;
        crate::stage::mark("add_committed");
        added?
    }

    /// [`JobService::add_many`] with every job's options.
    pub async fn add_many_with(&self, job_type: &[u8], jobs: &[JobSpec]) -> Result<(), AddManyError> {
        self.shared.check_open()?;
        let ks = &self.shared.ks;
        run_once(self.shared.db.as_ref(), self.shared.write, ks, |tx| async move {
            ops::add_many_jobs(&tx, ks, job_type, jobs, wall_ms()).await
        })
        .await
        .map_err(Error::from)?
    }

    /// Adds every job or none, in one transaction (see [`ops::add_many`]
    /// for the size limits).
    pub async fn add_many(&self, job_type: &[u8], jobs: &[NewJob]) -> Result<(), AddManyError> {
        self.shared.check_open()?;
        let ks = &self.shared.ks;
        run_once(self.shared.db.as_ref(), self.shared.write, ks, |tx| async move {
            ops::add_many(&tx, ks, job_type, jobs).await
        })
        .await
        .map_err(Error::from)?
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
        let shared = &self.shared;
        if let Err(e) = shared.check_open().and_then(|()| check_key(&shared.ks.member(&worker_type, &worker))) {
            let _ = reply.deliver(Err(e));
            return;
        }
        if timeout.is_zero() {
            let s = shared.clone();
            shared.spawn(async move {
                let outcome = s.accept_now(&worker_type, &worker, incarnation).await;
                let taken = outcome.as_ref().ok().cloned();
                if !reply.deliver(outcome) {
                    if let Some(handle) = taken {
                        s.release(handle).await;
                    }
                }
            });
            return;
        }
        let now = Instant::now();
        let deadline = now.checked_add(timeout).unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400));
        shared.dispatchers.waiting.fetch_add(1, Ordering::Relaxed);
        shared.dispatchers.submit(
            shared,
            &worker_type,
            Waiter { worker, incarnation, deadline, reply, signals: false },
        );
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
            self.shared.check_open()?;
            check_key(&self.shared.ks.member(worker_type, worker))?;
            return self.shared.accept_now(worker_type, worker, incarnation).await;
        }
        let (reply, guard, receiver) = future_reply();
        self.accept_registered_with(worker_type.to_vec(), worker.to_vec(), incarnation, timeout, Box::new(reply));
        let outcome = receiver.await.unwrap_or(Err(Error::Store(StoreError::Closed)));
        guard.disarm();
        outcome
    }

    /// Replaces the info of the job the fence's accept holds. `Canceled`
    /// if a cancel was requested (the job is now canceled and no longer
    /// the worker's); `NotOwner` if that accept no longer holds it;
    /// `NotFound` if it was removed.
    pub async fn update(&self, fence: &Fence, info: &[u8]) -> Result<JobHandle, Error> {
        self.shared.check_open()?;
        let ks = &self.shared.ks;
        // Its own receipt: after an unknown commit, the job's state cannot
        // say whether this call wrote the info or the cancellation.
        let db = self.shared.db.as_ref();
        let receipt = db.commits_may_be_unknown().then(|| Receipt::new(ks));
        let receipt = receipt.as_ref();
        let (outcome, commit) = run_attempts(db, self.shared.write, |tx, attempt| async move {
            if let Some(r) = receipt.filter(|_| attempt.may_have_committed) {
                match r.landed(&tx).await?.as_deref() {
                    Some(receipt::CANCELED) => return Ok(Err(Error::Canceled)),
                    // The job as the landed update left it (its VS complete).
                    Some(_) => {
                        let job = ops::get(&tx, ks, &fence.job_type, &fence.job_id).await?;
                        return Ok(job
                            .map(|job| JobHandle { job, token: fence.token, queued_at: None })
                            .ok_or(Error::NotFound));
                    }
                    None => {}
                }
            }
            let outcome = ops::update(&tx, ks, fence, info).await?;
            match (&outcome, receipt) {
                (Ok(_), Some(r)) => r.write(&tx, receipt::DONE),
                (Err(Error::Canceled), Some(r)) => r.write(&tx, receipt::CANCELED),
                _ => {}
            }
            Ok(outcome)
        })
        .await?;
        let mut handle = outcome?;
        complete_handle_vs(&mut handle, &commit)?;
        Ok(handle)
    }

    /// Finishes the job the fence's accept holds.
    pub async fn finish(&self, fence: &Fence, result: &[u8]) -> Result<(), Error> {
        self.shared.check_open()?;
        let ks = &self.shared.ks;
        run_once(self.shared.db.as_ref(), self.shared.write, ks, |tx| async move {
            Ok(ops::finish(&tx, ks, fence, result).await?.map(|_| ()))
        })
        .await?
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
        self.shared.check_open()?;
        check_key(&self.shared.ks.member(next.worker_type, next.worker))?;
        self.shared.finish_accept(fence, result, next).await
    }

    /// Gives back a job taken for a caller that no longer waits for it
    /// (its delivery failed): pending again, if that accept still holds it.
    pub async fn give_back(&self, handle: JobHandle) {
        self.shared.release(handle).await
    }

    /// Ends the run the fence's accept holds as `end` says.
    async fn end(&self, fence: &Fence, end: RunEnd) -> Result<(), Error> {
        self.shared.check_open()?;
        let ks = &self.shared.ks;
        let e = &end;
        run_once(self.shared.db.as_ref(), self.shared.write, ks, |tx| async move {
            Ok(ops::end(&tx, ks, fence, e.clone()).await?.map(|_| ()))
        })
        .await?
    }

    /// The run failed (`job_fail/3`): `error` (a JSON object) is stored;
    /// the job is retried as `retry` says while it has attempts left, else
    /// it ends `failed`.
    pub async fn fail(&self, fence: &Fence, error: &[u8], retry: Retry) -> Result<(), Error> {
        self.end(fence, RunEnd::Failed { error: error.to_vec(), retry }).await
    }

    /// The worker gives the job back without a failure (`job_release/2`):
    /// queued as `opts.schedule` says, with `info` and `opts.priority` if
    /// given; `max_attempts` is raised by one.
    pub async fn release(&self, fence: &Fence, opts: &JobOpts, info: Option<&[u8]>) -> Result<(), Error> {
        self.end(fence, RunEnd::Released { opts: *opts, info: info.map(<[u8]>::to_vec), bump: true }).await
    }

    /// Adds the job or runs it again (see [`ops::resubmit`]); with
    /// `if_vs`, `Changed` unless the job exists with that `vs`.
    pub async fn resubmit(
        &self,
        job_type: &[u8],
        id: &[u8],
        info: &[u8],
        opts: &JobOpts,
        if_vs: Option<&JobVs>,
    ) -> Result<(), Error> {
        self.shared.check_open()?;
        ops::check_job_key(&self.shared.ks, job_type, id)?;
        let ks = &self.shared.ks;
        run_once(self.shared.db.as_ref(), self.shared.write, ks, |tx| async move {
            ops::resubmit(&tx, ks, job_type, id, info, opts, if_vs, wall_ms()).await
        })
        .await?
    }

    /// Removes a job in any state; with `if_vs`, only if its `vs` is
    /// still that (`Changed`).
    pub async fn remove_if(&self, job_type: &[u8], id: &[u8], if_vs: Option<&JobVs>) -> Result<(), Error> {
        self.shared.check_open()?;
        let ks = &self.shared.ks;
        run_once(self.shared.db.as_ref(), self.shared.write, ks, |tx| async move {
            ops::remove_if(&tx, ks, job_type, id, if_vs).await
        })
        .await?
    }

    /// The exact number of the type's jobs per state, in
    /// [`JobState::ALL`]'s order.
    pub async fn counts(&self, job_type: &[u8]) -> Result<[(JobState, u64); 6], Error> {
        self.shared.check_open()?;
        check_key(&self.shared.ks.state_count(job_type, b"scheduled"))?;
        let ks = &self.shared.ks;
        let n =
            run(self.shared.db.as_ref(), self.shared.read, |tx| async move { ops::counts(&tx, ks, job_type).await })
                .await?;
        Ok(std::array::from_fn(|i| (JobState::ALL[i], n[i])))
    }

    /// The job types that have jobs.
    pub async fn job_types(&self) -> Result<Vec<Vec<u8>>, Error> {
        self.shared.check_open()?;
        let ks = &self.shared.ks;
        Ok(run(self.shared.db.as_ref(), self.shared.read, |tx| async move { ops::job_types(&tx, ks).await }).await?)
    }

    /// One page of the type's jobs in id order (see [`ops::list`]).
    pub async fn list(
        &self,
        job_type: &[u8],
        states: Option<&[JobState]>,
        limit: usize,
        after: Option<&[u8]>,
    ) -> Result<(Vec<Job>, Option<Vec<u8>>), Error> {
        self.shared.check_open()?;
        check_key(&self.shared.ks.by_state(job_type, b"scheduled", after.unwrap_or_default()))?;
        let ks = &self.shared.ks;
        Ok(run(self.shared.db.as_ref(), self.shared.read, |tx| async move {
            ops::list(&tx, ks, job_type, states, limit, after).await
        })
        .await?)
    }

    /// Pauses or resumes the type, cluster-wide.
    pub async fn set_paused(&self, job_type: &[u8], paused: bool) -> Result<(), Error> {
        self.shared.check_open()?;
        check_key(&self.shared.ks.paused(job_type))?;
        let ks = &self.shared.ks;
        Ok(run(self.shared.db.as_ref(), self.shared.write, |tx| async move {
            ops::set_paused(&tx, ks, job_type, paused).await
        })
        .await?)
    }

    /// Cancels a job (see [`ops::cancel`]).
    pub async fn cancel(&self, job_type: &[u8], id: &[u8]) -> Result<(), Error> {
        self.shared.check_open()?;
        let ks = &self.shared.ks;
        run_once(self.shared.db.as_ref(), self.shared.write, ks, |tx| async move {
            Ok(ops::cancel(&tx, ks, job_type, id).await?.map(|_| ()))
        })
        .await?
    }

    /// Removes a job in any state.
    pub async fn remove(&self, job_type: &[u8], id: &[u8]) -> Result<(), Error> {
        self.shared.check_open()?;
        let ks = &self.shared.ks;
        run_once(self.shared.db.as_ref(), self.shared.write, ks, |tx| async move {
            ops::remove(&tx, ks, job_type, id).await
        })
        .await?
    }

    pub async fn get(&self, job_type: &[u8], id: &[u8]) -> Result<Job, Error> {
        self.shared.check_open()?;
        read_current(&self.shared, job_type, id).await
    }

    /// The exact number of pending jobs of the type.
    pub async fn pending_count(&self, job_type: &[u8]) -> Result<u64, Error> {
        self.shared.check_open()?;
        check_key(&self.shared.ks.pending_count(job_type))?;
        let ks = &self.shared.ks;
        Ok(run(
            self.shared.db.as_ref(),
            self.shared.read,
            |tx| async move { ops::pending_count(&tx, ks, job_type).await },
        )
        .await?)
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
        self.shared.check_open()?;
        let current = read_current(&self.shared, job_type, id).await?;
        Ok(self.shared.watchers.subscribe(&self.shared, current, on_event))
    }
}
