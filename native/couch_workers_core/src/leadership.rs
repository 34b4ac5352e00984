//! Leadership of a worker type: its member with the oldest current
//! registration leads. Nothing is kept alive for it: the registration's
//! seniority key (`workers.rs`, written and cleared with the registration
//! itself, in the same transactions) orders the members, so the leader
//! changes exactly when the oldest registration goes, by whatever ends
//! it: an unregister, its owner's death, a reap by the liveness rule, a
//! replacing registration of its id.
//!
//! The epoch ([`crate::workers::epoch`]) names one registration's
//! leadership: a later leader's compares greater. A fenced write
//! (`if_leader`) reads the leader in its own transaction, not as a
//! snapshot, so a change of leader that commits first makes it conflict
//! and check again: it writes only while its epoch leads.
//!
//! Above `workers` and `jobs` (the fence joins a worker read and a job
//! write); the node's watcher that tells owners is
//! `services/leadership.rs`.

use std::sync::Arc;

use crate::context::Context;
use crate::error::{check_key, Error};
use crate::jobs::ops;
use crate::jobs::place::wall_ms;
use crate::jobs::{JobOpts, JobSpec, JobVs};
use crate::keyspace::Keyspace;
use crate::store::receipt::{self, run_retry_safe};
use crate::store::{run, StoreError, Tx};
use crate::workers;

/// `if_leader => {WorkerType, Epoch}`: write only while `epoch` is the
/// type's leadership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderFence {
    pub worker_type: Vec<u8>,
    pub epoch: Vec<u8>,
}

/// Leadership reads and fenced writes on one context. Cheap to clone.
#[derive(Clone)]
pub struct Leadership {
    ctx: Arc<Context>,
}

/// Whether `fence` still leads, read in `tx` for its conflicts.
pub async fn leads(tx: &Tx, ks: &Keyspace, fence: &LeaderFence) -> Result<bool, StoreError> {
    let leader = workers::read_leader(tx, ks, &fence.worker_type, false).await?;
    Ok(leader.is_some_and(|l| l.epoch == fence.epoch))
}

impl Leadership {
    pub fn new(ctx: Arc<Context>) -> Leadership {
        Leadership { ctx }
    }

    /// The fence `if_leader => {WorkerType, Epoch}`.
    pub fn fence(worker_type: &[u8], epoch: &[u8]) -> LeaderFence {
        LeaderFence { worker_type: worker_type.to_vec(), epoch: epoch.to_vec() }
    }

    /// The type's leader, `(id, epoch)`, at one read version; `None`
    /// when it has no registered worker.
    pub async fn leader(&self, worker_type: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>, Error> {
        self.ctx.check_open()?;
        check_key(&self.ctx.ks.seniority_range(worker_type).1)?;
        let ks = &self.ctx.ks;
        let leader =
            run(self.ctx.db.as_ref(), self.ctx.read, |tx| async move { workers::read_leader(&tx, ks, worker_type, true).await })
                .await?;
        Ok(leader.map(|l| (l.id, l.epoch)))
    }

    /// `job_add/4` with `if_leader`: `NotLeader` and nothing written
    /// unless `fence` leads in the transaction that adds.
    pub async fn add(&self, job_type: &[u8], id: &[u8], info: &[u8], opts: &JobOpts, fence: &LeaderFence) -> Result<(), Error> {
        self.ctx.check_open()?;
        check_key(&self.ctx.ks.seniority_range(&fence.worker_type).1)?;
        let job = JobSpec { id: id.to_vec(), info: info.to_vec(), opts: opts.clone() };
        let (ks, j) = (&self.ctx.ks, &job);
        run_once_fenced(&self.ctx, Some(fence), |tx| async move { ops::add_job(&tx, ks, job_type, j, wall_ms()).await }).await
    }

    /// `job_resubmit/4` with `if_leader` (and `if_vs`, as
    /// [`crate::Jobs::resubmit`]).
    pub async fn resubmit(
        &self,
        job_type: &[u8],
        id: &[u8],
        info: &[u8],
        opts: &JobOpts,
        if_vs: Option<&JobVs>,
        fence: &LeaderFence,
    ) -> Result<(), Error> {
        self.ctx.check_open()?;
        check_key(&self.ctx.ks.seniority_range(&fence.worker_type).1)?;
        ops::check_job_key(&self.ctx.ks, job_type, id)?;
        let ks = &self.ctx.ks;
        run_once_fenced(&self.ctx, Some(fence), |tx| async move {
            ops::resubmit(&tx, ks, job_type, id, info, opts, if_vs, wall_ms()).await
        })
        .await
    }

}

/// Runs `write` after the fence's check (when there is a fence), in one
/// transaction, once: its receipt answers a retry after an unknown
/// commit, as the unfenced job writes do (`store::receipt`). A fence that
/// fails, or a write that answers an error, wrote nothing and sets no
/// receipt.
pub(crate) async fn run_once_fenced<F, Fut>(ctx: &Context, fence: Option<&LeaderFence>, write: F) -> Result<(), Error>
where
    F: Fn(Tx) -> Fut,
    Fut: std::future::Future<Output = Result<Result<(), Error>, StoreError>>,
{
    let (ks, write) = (&ctx.ks, &write);
    let (outcome, _) = run_retry_safe(ctx.db.as_ref(), ctx.write, ks, |tx, landed| async move {
        if landed.is_some() {
            return Ok((Ok(()), None));
        }
        if let Some(fence) = fence {
            if !leads(&tx, ks, fence).await? {
                return Ok((Err(Error::NotLeader), None));
            }
        }
        let outcome = write(tx).await?;
        let done = outcome.is_ok().then(|| receipt::DONE.to_vec());
        Ok((outcome, done))
    })
    .await?;
    outcome
}
