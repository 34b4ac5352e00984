//! Recurring jobs (`couch_workers_core::recurring::Schedules`):
//!
//! * `schedule_set(Ref, Type, Id, Spec, Info, Opts, Fence)`: `Spec` and
//!   `Info` maps (else `badarg`), `Opts` the job options tuple of
//!   `job_add`, `Fence` `undefined` or `{WorkerType, Epoch}`. A `Spec`
//!   that JSON cannot hold is answered at once `{error, {bad_schedule,
//!   Why}}`; the core's checks of the spec come in the reply the same
//!   way (`Why` a binary). Budgeted like `job_add` (`dirty`, and the
//!   twin `schedule_set_dirty/7`).
//! * `schedule_remove(Ref, Type, Id)`: `ok` or `{error, not_found}`.
//! * `schedules(Ref, Type)`: `{ok, [#{id, spec, info, opts, next_run_at,
//!   last_run}]}`, `spec` and `info` decoded from JSON (binary keys),
//!   `opts` the tuple `{Priority, MaxAttempts, Keep, Group, ActivityTimeout}` (`undefined` when
//!   not given, `infinity`), `last_run` a job id or `null`.
//! * `schedule_types(Ref)`: `{ok, [Type]}`, the job types that have at
//!   least one schedule, in byte order (a type with no job yet too).

// `schedule_set/7`: its Erlang arity and the environment make eight
// arguments, in the NIF that `budgeted_nif!` expands to as well.
#![allow(clippy::too_many_arguments)]

use couch_workers_core::job_controls::ActivityTimeout;
use couch_workers_core::leaders::Leadership;
use couch_workers_core::recurring::{ScheduleEntry, Schedules};
use couch_workers_core::{Error as CoreError, Keep, MaxAttempts};
use rustler::{Encoder, Env, NifResult, Term};
use serde_json::Value;

use super::args::{check_ref, job_args, json_arg, opts_arg, type_args};
use super::fenced::fence_arg;
use super::terms::types_answer;
use super::{spawn_call, ErrorAnswer};
use crate::atoms;
use crate::json::{self, budgeted_nif, json_bytes_to_term, Sched};
use crate::reply::Answer;
use crate::term::binary;

/// A schedule call's error: `{error, {bad_schedule, Why}}` for a bad
/// spec, else as every job call's.
struct ScheduleError(CoreError);

impl ErrorAnswer for ScheduleError {
    fn into_answer(self) -> Answer {
        match self.0 {
            CoreError::BadSchedule(why) => bad_schedule(why),
            e => super::terms::core_error(&e),
        }
    }
}

fn bad_schedule(why: String) -> Answer {
    Box::new(move |env: Env<'_>| (atoms::error(), (atoms::bad_schedule(), binary(env, why.as_bytes()))).encode(env))
}

budgeted_nif!(schedule_set, schedule_set_dirty, set(reference, job_type, id, spec, info, opts, fence));

fn set<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    job_type: Term<'a>,
    id: Term<'a>,
    spec: Term<'a>,
    info: Term<'a>,
    opts: Term<'a>,
    fence: Term<'a>,
    sched: Sched,
) -> NifResult<Term<'a>> {
    let (job_type, id) = job_args(reference, job_type, id)?;
    let opts = opts_arg(opts)?;
    let fence = if fence.is_atom() { None } else { Some(fence_arg(fence)?) };
    let spec = match json::map_to_json(spec, 4096, Sched::Normal) {
        None => return Err(rustler::Error::BadArg),
        Some(Ok(map)) => serde_json::to_vec(&Value::Object(map)).map_err(|_| rustler::Error::BadArg)?,
        Some(Err(e)) => {
            let why = format!("{e}");
            return Ok((atoms::error(), (atoms::bad_schedule(), binary(env, why.as_bytes()))).encode(env));
        }
    };
    let info = try_json!(json_arg(env, info, sched, atoms::invalid_info()));
    let Some(opts) = opts else {
        return Ok((atoms::error(), atoms::invalid_priority()).encode(env));
    };
    spawn_call(
        env,
        reference,
        move |jobs| async move {
            let fence = fence.map(|(worker_type, epoch)| Leadership::fence(&worker_type, &epoch));
            Schedules::new(jobs.context().clone())
                .set(&job_type, &id, &spec, &info, &opts, fence.as_ref())
                .await
                .map_err(ScheduleError)
        },
        super::terms::ok_answer,
    )
}

#[rustler::nif]
fn schedule_remove<'a>(env: Env<'a>, reference: Term<'a>, job_type: Term<'a>, id: Term<'a>) -> NifResult<Term<'a>> {
    let (job_type, id) = job_args(reference, job_type, id)?;
    spawn_call(
        env,
        reference,
        move |jobs| async move {
            Schedules::new(jobs.context().clone()).remove(&job_type, &id).await.map_err(ScheduleError)
        },
        super::terms::ok_answer,
    )
}

#[rustler::nif]
fn schedules<'a>(env: Env<'a>, reference: Term<'a>, job_type: Term<'a>) -> NifResult<Term<'a>> {
    let job_type = type_args(reference, job_type)?;
    spawn_call(
        env,
        reference,
        move |jobs| async move { Schedules::new(jobs.context().clone()).list(&job_type).await.map_err(ScheduleError) },
        list_answer,
    )
}

#[rustler::nif]
fn schedule_types<'a>(env: Env<'a>, reference: Term<'a>) -> NifResult<Term<'a>> {
    check_ref(reference)?;
    spawn_call(
        env,
        reference,
        move |jobs| async move { Schedules::new(jobs.context().clone()).job_types().await.map_err(ScheduleError) },
        types_answer,
    )
}

fn list_answer(entries: Vec<ScheduleEntry>) -> Answer {
    Box::new(move |env: Env<'_>| {
        let list: Vec<Term<'_>> = entries.iter().map(|e| entry_term(env, e)).collect();
        (atoms::ok(), list).encode(env)
    })
}

fn entry_term<'a>(env: Env<'a>, e: &ScheduleEntry) -> Term<'a> {
    let undefined = || atoms::undefined().encode(env);
    let max_attempts = match e.opts.max_attempts {
        None => undefined(),
        Some(MaxAttempts::Infinity) => atoms::infinity().encode(env),
        Some(MaxAttempts::Limit(n)) => n.encode(env),
    };
    let keep = match e.opts.keep {
        None => undefined(),
        Some(Keep::Infinity) => atoms::infinity().encode(env),
        Some(Keep::Seconds(s)) => s.encode(env),
    };
    let priority = e.opts.priority.map_or_else(undefined, |p| p.encode(env));
    let group = e.opts.group.as_deref().map_or_else(undefined, |g| binary(env, g));
    let activity_timeout = match e.opts.activity_timeout {
        None => undefined(),
        Some(ActivityTimeout::Infinity) => atoms::infinity().encode(env),
        Some(ActivityTimeout::Seconds(s)) => s.encode(env),
    };
    let last_run = e.last_run.as_ref().map_or_else(|| atoms::null().encode(env), |id| binary(env, id));
    let keys = [
        atoms::id().encode(env),
        atoms::spec().encode(env),
        atoms::info().encode(env),
        atoms::opts().encode(env),
        atoms::next_run_at().encode(env),
        atoms::last_run().encode(env),
    ];
    let values = [
        binary(env, &e.id),
        json_bytes_to_term(env, &e.spec_json),
        json_bytes_to_term(env, &e.info),
        (priority, max_attempts, keep, group, activity_timeout).encode(env),
        e.next_run_at.encode(env),
        last_run,
    ];
    json::make_map(env, &keys, &values)
}
