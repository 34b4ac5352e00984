//! The stateless job API: every job call that needs no running task of
//! a node, one transaction (a few for a page or a promotion) on a
//! [`Context`]. Usable without a node: the command line runs its `job`,
//! `cancel`, `remove`, `retry`, `pause` and `resume` here, and starts
//! nothing. The node's job service ([`super::JobService`]) is this API plus
//! the calls that need its tasks (accept, subscribe).
//!
//! Every call that returns has committed its write.

use std::sync::Arc;

use super::commit::{complete_handle_vs, run_once};
use super::job::{AddManyError, Fence, Job, JobHandle, JobOpts, JobSpec, JobState, JobVs, NewJob};
use super::ops::{self, Retry, RunEnd};
use super::place::wall_ms;
use super::subscription::read_current;
use crate::context::Context;
use crate::error::{check_key, Error};
use crate::store::receipt::{self, run_retry_safe};
use crate::store::run;

/// The job calls on one context. Cheap to clone.
#[derive(Clone)]
pub struct Jobs {
    ctx: Arc<Context>,
}

impl Jobs {
    pub fn new(ctx: Arc<Context>) -> Jobs {
        Jobs { ctx }
    }

    /// The context the calls run on.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Adds a pending job: `AlreadyExists` if the id exists in any state.
    pub async fn add(&self, job_type: &[u8], id: &[u8], info: &[u8], priority: i64) -> Result<(), Error> {
        self.ctx.check_open()?;
        let job = NewJob { id: id.to_vec(), info: info.to_vec(), priority };
        let ks = &self.ctx.ks;
        let j = &job;
        run_once(self.ctx.db.as_ref(), self.ctx.write, ks, |tx| async move { ops::add(&tx, ks, job_type, j).await })
            .await?
    }

    /// Adds a job with its options (`job_add/4`): scheduled, or pending at
    /// once; `AlreadyExists` if the id exists in any state.
    pub async fn add_with(&self, job_type: &[u8], id: &[u8], info: &[u8], opts: &JobOpts) -> Result<(), Error> {
        self.ctx.check_open()?;
        let job = JobSpec { id: id.to_vec(), info: info.to_vec(), opts: opts.clone() };
        let ks = &self.ctx.ks;
        let j = &job;
        crate::stage::mark("add_task_runs");
        let added = run_once(self.ctx.db.as_ref(), self.ctx.write, ks, |tx| async move {
            ops::add_job(&tx, ks, job_type, j, wall_ms()).await
        })
        .await;
        crate::stage::mark("add_committed");
        added?
    }

    /// [`JobService::add_many`] with every job's options.
    pub async fn add_many_with(&self, job_type: &[u8], jobs: &[JobSpec]) -> Result<(), AddManyError> {
        self.ctx.check_open()?;
        let ks = &self.ctx.ks;
        run_once(self.ctx.db.as_ref(), self.ctx.write, ks, |tx| async move {
            ops::add_many_jobs(&tx, ks, job_type, jobs, wall_ms()).await
        })
        .await
        .map_err(Error::from)?
    }

    /// Adds every job or none, in one transaction (see [`ops::add_many`]
    /// for the size limits).
    pub async fn add_many(&self, job_type: &[u8], jobs: &[NewJob]) -> Result<(), AddManyError> {
        self.ctx.check_open()?;
        let ks = &self.ctx.ks;
        run_once(
            self.ctx.db.as_ref(),
            self.ctx.write,
            ks,
            |tx| async move { ops::add_many(&tx, ks, job_type, jobs).await },
        )
        .await
        .map_err(Error::from)?
    }

    /// Replaces the info of the job the fence's accept holds. `Canceled`
    /// if a cancel was requested (the job is now canceled and no longer
    /// the worker's); `NotOwner` if that accept no longer holds it;
    /// `NotFound` if it was removed.
    pub async fn update(&self, fence: &Fence, info: &[u8]) -> Result<JobHandle, Error> {
        self.ctx.check_open()?;
        let ks = &self.ctx.ks;
        // Its own receipt: after an unknown commit, the job's state cannot
        // say whether this call wrote the info or the cancellation.
        let (outcome, commit) = run_retry_safe(self.ctx.db.as_ref(), self.ctx.write, ks, |tx, landed| async move {
            match landed.as_deref() {
                Some(receipt::CANCELED) => return Ok((Err(Error::Canceled), None)),
                // The job as the landed update left it (its VS complete).
                Some(_) => {
                    let job = ops::get(&tx, ks, &fence.job_type, &fence.job_id).await?;
                    let handle = job.map(|job| JobHandle { job, token: fence.token, queued_at: None });
                    return Ok((handle.ok_or(Error::NotFound), None));
                }
                None => {}
            }
            let outcome = ops::update(&tx, ks, fence, info).await?;
            let wrote = match &outcome {
                Ok(_) => Some(receipt::DONE.to_vec()),
                Err(Error::Canceled) => Some(receipt::CANCELED.to_vec()),
                Err(_) => None,
            };
            Ok((outcome, wrote))
        })
        .await?;
        let mut handle = outcome?;
        complete_handle_vs(&mut handle, &commit)?;
        Ok(handle)
    }

    /// Finishes the job the fence's accept holds.
    pub async fn finish(&self, fence: &Fence, result: &[u8]) -> Result<(), Error> {
        self.ctx.check_open()?;
        let ks = &self.ctx.ks;
        run_once(self.ctx.db.as_ref(), self.ctx.write, ks, |tx| async move {
            Ok(ops::finish(&tx, ks, fence, result).await?.map(|_| ()))
        })
        .await?
    }

    /// Ends the run the fence's accept holds as `end` says.
    async fn end(&self, fence: &Fence, end: RunEnd) -> Result<(), Error> {
        self.ctx.check_open()?;
        let ks = &self.ctx.ks;
        let e = &end;
        run_once(self.ctx.db.as_ref(), self.ctx.write, ks, |tx| async move {
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
        self.end(fence, RunEnd::Released { opts: opts.clone(), info: info.map(<[u8]>::to_vec), bump: true }).await
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
        self.ctx.check_open()?;
        ops::check_job_key(&self.ctx.ks, job_type, id)?;
        let ks = &self.ctx.ks;
        run_once(self.ctx.db.as_ref(), self.ctx.write, ks, |tx| async move {
            ops::resubmit(&tx, ks, job_type, id, info, opts, if_vs, wall_ms()).await
        })
        .await?
    }

    /// Removes a job in any state; with `if_vs`, only if its `vs` is
    /// still that (`Changed`).
    pub async fn remove_if(&self, job_type: &[u8], id: &[u8], if_vs: Option<&JobVs>) -> Result<(), Error> {
        self.ctx.check_open()?;
        let ks = &self.ctx.ks;
        run_once(self.ctx.db.as_ref(), self.ctx.write, ks, |tx| async move {
            ops::remove_if(&tx, ks, job_type, id, if_vs).await
        })
        .await?
    }

    /// The exact number of the type's jobs per state, in
    /// [`JobState::ALL`]'s order.
    pub async fn counts(&self, job_type: &[u8]) -> Result<[(JobState, u64); 6], Error> {
        self.ctx.check_open()?;
        check_key(&self.ctx.ks.state_count(job_type, b"scheduled"))?;
        let ks = &self.ctx.ks;
        let n =
            run(self.ctx.db.as_ref(), self.ctx.read, |tx| async move { ops::counts(&tx, ks, job_type).await }).await?;
        Ok(std::array::from_fn(|i| (JobState::ALL[i], n[i])))
    }

    /// The job types that have jobs.
    pub async fn job_types(&self) -> Result<Vec<Vec<u8>>, Error> {
        self.ctx.check_open()?;
        let ks = &self.ctx.ks;
        Ok(run(self.ctx.db.as_ref(), self.ctx.read, |tx| async move { ops::job_types(&tx, ks).await }).await?)
    }

    /// One page of the type's jobs in id order (see [`ops::list`]).
    pub async fn list(
        &self,
        job_type: &[u8],
        states: Option<&[JobState]>,
        limit: usize,
        after: Option<&[u8]>,
    ) -> Result<(Vec<Job>, Option<Vec<u8>>), Error> {
        self.ctx.check_open()?;
        check_key(&self.ctx.ks.by_state(job_type, b"scheduled", after.unwrap_or_default()))?;
        let ks = &self.ctx.ks;
        Ok(run(self.ctx.db.as_ref(), self.ctx.read, |tx| async move {
            ops::list(&tx, ks, job_type, states, limit, after).await
        })
        .await?)
    }

    /// Pauses or resumes the type, cluster-wide.
    pub async fn set_paused(&self, job_type: &[u8], paused: bool) -> Result<(), Error> {
        self.ctx.check_open()?;
        check_key(&self.ctx.ks.paused(job_type))?;
        let ks = &self.ctx.ks;
        Ok(run(
            self.ctx.db.as_ref(),
            self.ctx.write,
            |tx| async move { ops::set_paused(&tx, ks, job_type, paused).await },
        )
        .await?)
    }

    /// Cancels a job (see [`ops::cancel`]).
    pub async fn cancel(&self, job_type: &[u8], id: &[u8]) -> Result<(), Error> {
        self.ctx.check_open()?;
        let ks = &self.ctx.ks;
        run_once(self.ctx.db.as_ref(), self.ctx.write, ks, |tx| async move {
            Ok(ops::cancel(&tx, ks, job_type, id).await?.map(|_| ()))
        })
        .await?
    }

    /// Removes a job in any state.
    pub async fn remove(&self, job_type: &[u8], id: &[u8]) -> Result<(), Error> {
        self.ctx.check_open()?;
        let ks = &self.ctx.ks;
        run_once(self.ctx.db.as_ref(), self.ctx.write, ks, |tx| async move { ops::remove(&tx, ks, job_type, id).await })
            .await?
    }

    pub async fn get(&self, job_type: &[u8], id: &[u8]) -> Result<Job, Error> {
        self.ctx.check_open()?;
        read_current(&self.ctx, job_type, id).await
    }

    /// The exact number of pending jobs of the type.
    pub async fn pending_count(&self, job_type: &[u8]) -> Result<u64, Error> {
        self.ctx.check_open()?;
        check_key(&self.ctx.ks.pending_count(job_type))?;
        let ks = &self.ctx.ks;
        Ok(run(self.ctx.db.as_ref(), self.ctx.read, |tx| async move { ops::pending_count(&tx, ks, job_type).await })
            .await?)
    }
}
