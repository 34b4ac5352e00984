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
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::dispatcher::{AcceptReply, Dispatchers, Waiter};
use super::job::{AddManyError, Fence, Job, JobHandle, NewJob};
use super::ops::{self, Take};
use super::record::complete_vs;
use super::runner::{commit_vs, complete_handle_vs, run_committed};
use super::subscription::{read_current, JobSubscription, OnJobEvent, Watchers};
use super::sweeper::run_sweeper;
use crate::error::{check_key, Error};
use crate::keyspace::Keyspace;
use crate::log::Logger;
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
}

#[derive(Default)]
pub(crate) struct JobCounts {
    pub dispatchers: Arc<AtomicUsize>,
    pub job_watchers: Arc<AtomicUsize>,
    pub sweepers: Arc<AtomicUsize>,
}

pub(crate) use crate::services::Live;

/// What the service's tasks share.
pub(crate) struct Shared {
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
}

impl Shared {
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

    /// One accept transaction for one worker, no waiting.
    async fn accept_now(&self, worker_type: &[u8], worker: &[u8]) -> Result<JobHandle, Error> {
        let workers = vec![worker.to_vec()];
        let ks = &self.ks;
        for _ in 0..ACCEPT_NOW_ROUNDS {
            let tokens = ops::new_tokens(1);
            let mut attempts = 0u32;
            let (round, info) = run_committed(self.db.as_ref(), self.write, |tx| {
                attempts += 1;
                let acceptors = ops::Acceptors { workers: &workers, tokens: &tokens, recheck: attempts > 1 };
                async move { ops::accept(&tx, ks, worker_type, acceptors).await }
            })
            .await?;
            let more = round.more;
            match round.takes.into_iter().next() {
                Some(Take::Job(mut handle)) => {
                    complete_handle_vs(&mut handle, &info)?;
                    return Ok(handle);
                }
                Some(Take::NoJob) if more => continue,
                _ => return Err(Error::NotFound),
            }
        }
        Err(Error::NotFound)
    }
}

/// The job queue of one node. Cheap to clone.
#[derive(Clone)]
pub struct JobService {
    shared: Arc<Shared>,
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
        let shared = Arc::new(Shared {
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
        });
        let live = Live::new(&shared.counts.sweepers);
        shared.spawn(run_sweeper(shared.clone(), shared.cancel.child_token(), live));
        JobService { shared }
    }

    pub fn stats(&self) -> JobStats {
        let s = &self.shared;
        JobStats {
            dispatchers: s.counts.dispatchers.load(Ordering::SeqCst),
            waiters: s.dispatchers.waiting.load(Ordering::SeqCst),
            job_watchers: s.counts.job_watchers.load(Ordering::SeqCst),
            sweepers: s.counts.sweepers.load(Ordering::SeqCst),
        }
    }

    /// Adds a pending job: `AlreadyExists` if the id exists in any state.
    pub async fn add(&self, job_type: &[u8], id: &[u8], info: &[u8], priority: i64) -> Result<(), Error> {
        self.shared.check_open()?;
        let job = NewJob { id: id.to_vec(), info: info.to_vec(), priority };
        let ks = &self.shared.ks;
        let j = &job;
        run(self.shared.db.as_ref(), self.shared.write, |tx| async move { ops::add(&tx, ks, job_type, j).await }).await?
    }

    /// Adds every job or none, in one transaction (see [`ops::add_many`]
    /// for the size limits).
    pub async fn add_many(&self, job_type: &[u8], jobs: &[NewJob]) -> Result<(), AddManyError> {
        self.shared.check_open()?;
        let ks = &self.shared.ks;
        run(self.shared.db.as_ref(), self.shared.write, |tx| async move { ops::add_many(&tx, ks, job_type, jobs).await })
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
        let shared = &self.shared;
        if let Err(e) = shared.check_open().and_then(|()| check_key(&shared.ks.member(&worker_type, &worker))) {
            let _ = reply.deliver(Err(e));
            return;
        }
        if timeout.is_zero() {
            let s = shared.clone();
            shared.spawn(async move {
                let outcome = s.accept_now(&worker_type, &worker).await;
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
        shared.dispatchers.submit(shared, &worker_type, Waiter { worker, deadline, reply });
    }

    /// [`JobService::accept_with`] as a future. Dropping the future before
    /// it resolves withdraws the acceptor (a job taken for it meanwhile
    /// goes back to pending).
    pub async fn accept(&self, worker_type: &[u8], worker: &[u8], timeout: Duration) -> Result<JobHandle, Error> {
        if timeout.is_zero() {
            self.shared.check_open()?;
            check_key(&self.shared.ks.member(worker_type, worker))?;
            return self.shared.accept_now(worker_type, worker).await;
        }
        let (sender, receiver) = oneshot::channel();
        self.accept_with(worker_type.to_vec(), worker.to_vec(), timeout, Box::new(sender));
        receiver.await.unwrap_or(Err(Error::Store(StoreError::Closed)))
    }

    /// Replaces the info of the job the fence's accept holds. `Canceled`
    /// if a cancel was requested (the job is now canceled and no longer
    /// the worker's); `NotOwner` if that accept no longer holds it;
    /// `NotFound` if it was removed.
    pub async fn update(&self, fence: &Fence, info: &[u8]) -> Result<JobHandle, Error> {
        self.shared.check_open()?;
        let ks = &self.shared.ks;
        let (outcome, commit) =
            run_committed(self.shared.db.as_ref(), self.shared.write, |tx| async move { ops::update(&tx, ks, fence, info).await }).await?;
        let mut handle = outcome?;
        complete_vs(&mut handle.job.vs, &commit_vs(&commit)?);
        Ok(handle)
    }

    /// Finishes the job the fence's accept holds.
    pub async fn finish(&self, fence: &Fence, result: &[u8]) -> Result<(), Error> {
        self.shared.check_open()?;
        let ks = &self.shared.ks;
        run(self.shared.db.as_ref(), self.shared.write, |tx| async move { ops::finish(&tx, ks, fence, result).await })
            .await?
            .map(|_| ())
    }

    /// Cancels a job (see [`ops::cancel`]).
    pub async fn cancel(&self, job_type: &[u8], id: &[u8]) -> Result<(), Error> {
        self.shared.check_open()?;
        let ks = &self.shared.ks;
        run(self.shared.db.as_ref(), self.shared.write, |tx| async move { ops::cancel(&tx, ks, job_type, id).await })
            .await?
            .map(|_| ())
    }

    /// Removes a job in any state.
    pub async fn remove(&self, job_type: &[u8], id: &[u8]) -> Result<(), Error> {
        self.shared.check_open()?;
        let ks = &self.shared.ks;
        run(self.shared.db.as_ref(), self.shared.write, |tx| async move { ops::remove(&tx, ks, job_type, id).await }).await?
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
        Ok(run(self.shared.db.as_ref(), self.shared.read, |tx| async move { ops::pending_count(&tx, ks, job_type).await })
            .await?)
    }

    /// The current job, and a subscription whose `on_event` gets every
    /// later change (`Changed` with a greater `vs` each time; `Removed`
    /// once, which ends it). `not_found` if the job does not exist.
    pub async fn subscribe(&self, job_type: &[u8], id: &[u8], on_event: OnJobEvent) -> Result<(Job, JobSubscription), Error> {
        self.shared.check_open()?;
        let current = read_current(&self.shared, job_type, id).await?;
        Ok(self.shared.watchers.subscribe(&self.shared, current, on_event))
    }
}
