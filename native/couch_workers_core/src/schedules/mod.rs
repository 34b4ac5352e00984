//! Recurring jobs. A schedule of a job type creates one job per due
//! slot, with the slot's id `ScheduleId@T` (`T` in Unix ms), in the
//! transaction that moves the schedule to its next slot: any node may
//! fire a slot, and the store makes sure each is fired once (`ops.rs`).
//! No leader is needed; `set` takes an optional `if_leader` fence.
//!
//! * `spec.rs`: the spec (`every`, `cron`, `start_at`, `overlap`,
//!   `catch_up`) and its slots;
//! * `record.rs`: the stored record;
//! * `ops.rs`: set, remove, list, the types that have schedules and a
//!   slot's firing, inside a transaction of the caller's;
//! * `runner.rs`: the node's task that sleeps until the earliest due
//!   slot of every type and fires it.
//!
//! Above `jobs` (a firing adds jobs) and `leadership` (the fence).

pub mod ops;
pub mod record;
pub(crate) mod runner;
pub mod spec;

use std::sync::Arc;

use crate::context::Context;
use crate::error::{check_key, Error};
use crate::jobs::place::wall_ms;
use crate::jobs::JobOpts;
use crate::leadership::{run_once_fenced, LeaderFence};
use crate::store::run;

pub use ops::ScheduleEntry;
use spec::Spec;

/// The schedule calls on one context. Cheap to clone.
#[derive(Clone)]
pub struct Schedules {
    ctx: Arc<Context>,
}

impl Schedules {
    pub fn new(ctx: Arc<Context>) -> Schedules {
        Schedules { ctx }
    }

    /// Sets (or replaces, from its next slot) the schedule `id` of
    /// `job_type`. `spec_json` is the spec as a JSON object; a bad one is
    /// `BadSchedule(why)`. With `fence`, written only while it leads.
    pub async fn set(
        &self,
        job_type: &[u8],
        id: &[u8],
        spec_json: &[u8],
        info: &[u8],
        opts: &JobOpts,
        fence: Option<&LeaderFence>,
    ) -> Result<(), Error> {
        self.ctx.check_open()?;
        let spec = Spec::parse(spec_json).map_err(Error::BadSchedule)?;
        let ks = &self.ctx.ks;
        check_key(&ks.schedule_due(i64::MAX, job_type, id))?;
        // The longest id a slot's job can have.
        check_key(&ks.job(job_type, &ops::slot_job_id(id, u64::MAX)))?;
        if let Some(f) = fence {
            check_key(&ks.seniority_range(&f.worker_type).1)?;
        }
        let spec = &spec;
        run_once_fenced(&self.ctx, fence, |tx| async move {
            ops::set(&tx, ks, job_type, id, spec, info, opts, wall_ms()).await
        })
        .await
    }

    /// Removes a schedule: `NotFound` if there is none. The jobs its
    /// slots created stay.
    pub async fn remove(&self, job_type: &[u8], id: &[u8]) -> Result<(), Error> {
        self.ctx.check_open()?;
        let ks = &self.ctx.ks;
        check_key(&ks.schedule_due(i64::MAX, job_type, id))?;
        run_once_fenced(&self.ctx, None, |tx| async move { ops::remove(&tx, ks, job_type, id).await }).await
    }

    /// The type's schedules, in id order.
    pub async fn list(&self, job_type: &[u8]) -> Result<Vec<ScheduleEntry>, Error> {
        self.ctx.check_open()?;
        let ks = &self.ctx.ks;
        check_key(&ks.schedules_range(job_type).1)?;
        Ok(run(self.ctx.db.as_ref(), self.ctx.read, |tx| async move { ops::list(&tx, ks, job_type).await }).await?)
    }

    /// The job types that have at least one schedule, in byte order
    /// (`ops::job_types`): a type scheduled before any of its jobs exist
    /// is among them.
    pub async fn job_types(&self) -> Result<Vec<Vec<u8>>, Error> {
        self.ctx.check_open()?;
        let ks = &self.ctx.ks;
        Ok(run(self.ctx.db.as_ref(), self.ctx.read, |tx| async move { ops::job_types(&tx, ks).await }).await?)
    }
}
