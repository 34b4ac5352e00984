//! The stateless calls on a job type's settings (`job_type_get/1`,
//! `job_type_set/2`, the command line's `type`), and a job with its run
//! history (`job_get/2`, the command line's `job`).

use super::history::Run;
use super::job::Job;
use super::ops;
use super::type_settings::{TypeSetting, TypeSettings};
use super::Jobs;
use crate::error::{check_key, Error};
use crate::store::run;

impl Jobs {
    /// The type's settings, defaults filled in.
    pub async fn type_settings(&self, job_type: &[u8]) -> Result<TypeSettings, Error> {
        let ctx = self.context();
        ctx.check_open()?;
        check_key(&ctx.ks.type_settings(job_type))?;
        let ks = &ctx.ks;
        Ok(run(ctx.db.as_ref(), ctx.read, |tx| async move { ops::type_settings(&tx, ks, job_type, true).await })
            .await?)
    }

    /// The job and its last runs, newest first, read in one transaction
    /// (`job_get/2`, the command line's `job`).
    pub async fn get_with_history(&self, job_type: &[u8], id: &[u8]) -> Result<(Job, Vec<Run>), Error> {
        let ctx = self.context();
        ctx.check_open()?;
        ops::check_job_key(&ctx.ks, job_type, id)?;
        let ks = &ctx.ks;
        let job = run(ctx.db.as_ref(), ctx.read, |tx| async move {
            ops::get_with_history(&tx, ks, job_type, id).await
        })
        .await?;
        job.ok_or(Error::NotFound)
    }

    /// Changes the settings `changes` names, cluster-wide, and returns
    /// them all as stored. `Invalid` (nothing written) for a value out of
    /// range. Idempotent, so a retry after an unknown commit needs no
    /// receipt: it reads what landed and writes nothing more.
    pub async fn set_type_settings(&self, job_type: &[u8], changes: &[TypeSetting]) -> Result<TypeSettings, Error> {
        let ctx = self.context();
        ctx.check_open()?;
        check_key(&ctx.ks.type_settings(job_type))?;
        let ks = &ctx.ks;
        run(ctx.db.as_ref(), ctx.write, |tx| async move { ops::set_type_settings(&tx, ks, job_type, changes).await })
            .await?
    }
}
