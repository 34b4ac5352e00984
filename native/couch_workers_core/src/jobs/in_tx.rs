//! Job calls inside a caller's FoundationDB transaction (couch_jobs' `Tx`
//! argument): the same operations as [`Jobs`]' own-transaction calls
//! (`jobs::ops`), run on a [`Forwarded`](crate::store::forward::Forwarded)
//! transaction whose owner (the NIF's caller, an erlfdb transaction)
//! performs every read and write and commits. The answer is the
//! operation's at the caller's read version; its writes land iff the
//! caller commits. No receipt is written (`store::receipt`): a commit whose
//! outcome is unknown is the caller's to resolve, as for its own writes
//! (erlfdb runs the caller's fun again, and each call answers on what the
//! landed attempt left: a finish `NotOwner`, an add `AlreadyExists`, as
//! couch_jobs' calls answer `halt` there).
//!
//! Every call reads the job's record without snapshot, so the record is in
//! the caller's read conflict set: an update that answered `Ok` in a
//! transaction that commits proves the job was still the handle's at the
//! commit (another node's takeover, cancel or removal fails the commit).
//!
//! Several calls in one caller's transaction share a session
//! (`store::overlay`): a later call reads what an earlier one wrote with
//! versionstamps (a job added, then read; updated, then finished).
//!
//! Only on FoundationDB: the embedded store's keys are not in an erlfdb
//! transaction's reach (`fdb_only`).
//!
//! A call that succeeded (a job added, resubmitted, finished, canceled or
//! removed) is counted in the caller's transaction too (`tx_counts.rs`):
//! its count lands iff the caller commits, once.

use std::sync::Arc;

use tokio::sync::mpsc::UnboundedReceiver;

use super::history::Run;
use super::job::{Fence, Job, JobHandle, JobOpts, JobSpec, JobVs};
use super::ops;
use super::tx_counts::{self, TxEvent};
use super::place::wall_ms;
use super::Jobs;
use crate::error::Error;
use crate::store::forward::{self, Answers, Sent};
use crate::store::overlay::{Overlaid, Session};
use crate::store::Tx;

/// One call's forwarding transaction: run one call on it, which consumes
/// it (its requests end when the call does).
pub struct TxJobs {
    jobs: Jobs,
    tx: Tx,
}

impl Jobs {
    /// A forwarding transaction for one call inside a caller's
    /// transaction, with the session of the calls made in it before
    /// (`store::overlay`), the requests it will make (in id order) and
    /// where the reads' answers go. `Invalid("fdb_only")` on a store other
    /// than FoundationDB.
    pub fn in_caller_tx(&self, session: Arc<Session>) -> Result<(TxJobs, UnboundedReceiver<Sent>, Answers), Error> {
        let ctx = self.context();
        ctx.check_open()?;
        if ctx.db.kind() != "fdb" {
            return Err(Error::Invalid("fdb_only"));
        }
        let (forwarded, requests, answers) = forward::channel();
        let tx: Tx = Arc::new(Overlaid::new(forwarded, session));
        Ok((TxJobs { jobs: self.clone(), tx }, requests, answers))
    }
}

impl TxJobs {
    /// Counts `event` of `job_type` in the caller's transaction when
    /// `result` is a success (on a node that counts: `tx_counts.rs`).
    fn counted<T>(&self, job_type: &[u8], event: TxEvent, result: Result<T, Error>) -> Result<T, Error> {
        let ctx = self.jobs.context();
        if let (Ok(_), Some(name)) = (&result, ctx.tx_counts_name.get()) {
            tx_counts::count(self.tx.as_ref(), &ctx.ks, name, job_type, event);
        }
        result
    }

    /// [`Jobs::add_with`] in the caller's transaction.
    pub async fn add(self, job_type: &[u8], id: &[u8], info: &[u8], opts: &JobOpts) -> Result<(), Error> {
        let job = JobSpec { id: id.to_vec(), info: info.to_vec(), opts: opts.clone() };
        let added = ops::add_job(&self.tx, &self.jobs.context().ks, job_type, &job, wall_ms()).await?;
        self.counted(job_type, TxEvent::Added, added)
    }

    /// [`Jobs::get`] in the caller's transaction (a job this transaction
    /// wrote is unreadable: FoundationDB's `accessed_unreadable`, as its
    /// record's versionstamp is not known before the commit).
    pub async fn get(self, job_type: &[u8], id: &[u8]) -> Result<(Job, Vec<Run>), Error> {
        let ks = &self.jobs.context().ks;
        ops::check_job_key(ks, job_type, id)?;
        // With its last runs, as `job_get/2` answers.
        ops::get_with_history(&self.tx, ks, job_type, id).await?.ok_or(Error::NotFound)
    }

    /// [`Jobs::update`] in the caller's transaction. The handle's `vs` is
    /// incomplete (its commit's versionstamp is not known inside the
    /// transaction). `Canceled` wrote the cancellation, which lands with
    /// the caller's commit.
    pub async fn update(self, fence: &Fence, info: &[u8]) -> Result<JobHandle, Error> {
        ops::update(&self.tx, &self.jobs.context().ks, fence, info).await?
    }

    /// [`Jobs::finish`] in the caller's transaction.
    pub async fn finish(self, fence: &Fence, result: &[u8]) -> Result<(), Error> {
        let finished = ops::finish(&self.tx, &self.jobs.context().ks, fence, result).await?.map(|_| ());
        self.counted(&fence.job_type, TxEvent::Finished, finished)
    }

    /// [`Jobs::resubmit`] in the caller's transaction.
    pub async fn resubmit(
        self,
        job_type: &[u8],
        id: &[u8],
        info: &[u8],
        opts: &JobOpts,
        if_vs: Option<&JobVs>,
    ) -> Result<(), Error> {
        let ks = &self.jobs.context().ks;
        ops::check_job_key(ks, job_type, id)?;
        let resubmitted = ops::resubmit(&self.tx, ks, job_type, id, info, opts, if_vs, wall_ms()).await?;
        self.counted(job_type, TxEvent::Resubmitted, resubmitted)
    }

    /// [`Jobs::remove_if`] in the caller's transaction.
    pub async fn remove(self, job_type: &[u8], id: &[u8], if_vs: Option<&JobVs>) -> Result<(), Error> {
        let removed = ops::remove_if(&self.tx, &self.jobs.context().ks, job_type, id, if_vs).await?;
        self.counted(job_type, TxEvent::Removed, removed)
    }

    /// [`Jobs::cancel`] in the caller's transaction.
    pub async fn cancel(self, job_type: &[u8], id: &[u8]) -> Result<(), Error> {
        let canceled = ops::cancel(&self.tx, &self.jobs.context().ks, job_type, id).await?.map(|_| ());
        self.counted(job_type, TxEvent::Canceled, canceled)
    }
}
