//! The job NIFs that are one call into the job service and one reply:
//! add, the worker's update and end of a run, and anyone's cancel, remove,
//! reads and pause.

use couch_workers_core::MAX_TRANSACTION_SIZE;
use couch_workers_core::{JobSpec, JobState};
use rustler::types::tuple::get_tuple;
use rustler::{Encoder, Env, Error, NifResult, Term};

use super::args::{
    check_ref, finish_args, handle_args, info_opts_args, job_args, json_arg, opts_arg, retry_arg, type_args, vs_arg,
};
use super::spawn_call;
use super::terms::{counts_answer, handle_answer, ok_answer, page_answer, types_answer};
use crate::atoms;
use crate::json::{budgeted_nif, Sched};
use crate::reply;
use crate::term::bytes_arg;

/// Most jobs in one `job_add_many` (the core's limit: one user version
/// per job within the commit).
const MAX_ADD_MANY: usize = 1 << 16;

// ---- add --------------------------------------------------------------------

budgeted_nif!(job_add, job_add_dirty, add(reference, job_type, id, info, opts));

fn add<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    job_type: Term<'a>,
    id: Term<'a>,
    info: Term<'a>,
    opts: Term<'a>,
    sched: Sched,
) -> NifResult<Term<'a>> {
    couch_workers_core::stage_mark("add_nif");
    let (job_type, id) = job_args(reference, job_type, id)?;
    let (info, opts) = try_json!(info_opts_args(env, info, opts, sched));
    spawn_call(env, reference, move |jobs| async move { jobs.add_with(&job_type, &id, &info, &opts).await }, ok_answer)
}

/// Runs on a dirty scheduler: a batch converts up to 10 MB of terms to
/// JSON.
#[rustler::nif(schedule = "DirtyCpu")]
fn job_add_many<'a>(env: Env<'a>, reference: Term<'a>, job_type: Term<'a>, list: Term<'a>) -> NifResult<Term<'a>> {
    let job_type = type_args(reference, job_type)?;
    let len = list.list_length()?;
    if len > MAX_ADD_MANY {
        return Ok((atoms::error(), atoms::transaction_too_large()).encode(env));
    }
    // Shapes first, so that a badarg anywhere wins over a value error.
    let mut items = Vec::with_capacity(len);
    for item in list.into_list_iterator()? {
        let fields = get_tuple(item)?;
        let [id, info, opts] = fields[..] else { return Err(Error::BadArg) };
        if !info.is_map() {
            return Err(Error::BadArg);
        }
        items.push((bytes_arg(id)?, info, opts_arg(opts)?));
    }
    // The whole batch must fit one transaction (the core refuses it
    // otherwise): stop converting as soon as it cannot.
    let mut total = 0usize;
    let mut jobs = Vec::with_capacity(len);
    for (id, info, opts) in items {
        let info = try_json!(json_arg(env, info, Sched::Dirty, atoms::invalid_info()));
        let Some(opts) = opts else {
            return Ok((atoms::error(), atoms::invalid_priority()).encode(env));
        };
        total += info.len() + id.len();
        if total > MAX_TRANSACTION_SIZE {
            return Ok((atoms::error(), atoms::transaction_too_large()).encode(env));
        }
        jobs.push(JobSpec { id: id.to_vec(), info, opts });
    }
    spawn_call(env, reference, move |service| async move { service.add_many_with(&job_type, &jobs).await }, ok_answer)
}

// ---- the worker's side: update, finish --------------------------------------

budgeted_nif!(job_update, job_update_dirty, update(reference, handle, info));

fn update<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    handle: Term<'a>,
    info: Term<'a>,
    sched: Sched,
) -> NifResult<Term<'a>> {
    let fence = handle_args(reference, handle)?;
    let info = try_json!(json_arg(env, info, sched, atoms::invalid_info()));
    spawn_call(env, reference, move |jobs| async move { jobs.update(&fence, &info).await }, handle_answer)
}

budgeted_nif!(job_finish, job_finish_dirty, finish(reference, handle, result));

fn finish<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    handle: Term<'a>,
    result: Term<'a>,
    sched: Sched,
) -> NifResult<Term<'a>> {
    let (fence, result) = try_json!(finish_args(env, reference, handle, result, sched));
    spawn_call(env, reference, move |jobs| async move { jobs.finish(&fence, &result).await }, ok_answer)
}

budgeted_nif!(job_fail, job_fail_dirty, fail(reference, handle, error, retry));

fn fail<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    handle: Term<'a>,
    error: Term<'a>,
    retry: Term<'a>,
    sched: Sched,
) -> NifResult<Term<'a>> {
    let fence = handle_args(reference, handle)?;
    let retry = retry_arg(retry)?;
    let error = try_json!(json_arg(env, error, sched, atoms::invalid_info()));
    spawn_call(env, reference, move |jobs| async move { jobs.fail(&fence, &error, retry).await }, ok_answer)
}

budgeted_nif!(job_release, job_release_dirty, release(reference, handle, info, opts));

fn release<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    handle: Term<'a>,
    info: Term<'a>,
    opts: Term<'a>,
    sched: Sched,
) -> NifResult<Term<'a>> {
    let fence = handle_args(reference, handle)?;
    let opts = opts_arg(opts)?;
    // `undefined` (keep the info) or a map.
    let info = if info.is_map() {
        Some(try_json!(json_arg(env, info, sched, atoms::invalid_info())))
    } else if vs_arg(info)?.is_none() {
        None
    } else {
        return Err(Error::BadArg);
    };
    let Some(opts) = opts else {
        return Ok((atoms::error(), atoms::invalid_priority()).encode(env));
    };
    spawn_call(env, reference, move |jobs| async move { jobs.release(&fence, &opts, info.as_deref()).await }, ok_answer)
}

budgeted_nif!(job_resubmit, job_resubmit_dirty, resubmit(reference, job_type, id, info, opts, if_vs));

// The NIF's six arguments (its Erlang arity), the environment and the
// scheduler it runs on: the shape every `budgeted_nif!` body has.
#[allow(clippy::too_many_arguments)]
fn resubmit<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    job_type: Term<'a>,
    id: Term<'a>,
    info: Term<'a>,
    opts: Term<'a>,
    if_vs: Term<'a>,
    sched: Sched,
) -> NifResult<Term<'a>> {
    let (job_type, id) = job_args(reference, job_type, id)?;
    let if_vs = vs_arg(if_vs)?;
    let (info, opts) = try_json!(info_opts_args(env, info, opts, sched));
    spawn_call(
        env,
        reference,
        move |jobs| async move { jobs.resubmit(&job_type, &id, &info, &opts, if_vs.as_ref()).await },
        ok_answer,
    )
}

// ---- anyone's side: cancel, remove, get, count --------------------------------

#[rustler::nif]
fn job_remove_if<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    job_type: Term<'a>,
    id: Term<'a>,
    vs: Term<'a>,
) -> NifResult<Term<'a>> {
    let (job_type, id) = job_args(reference, job_type, id)?;
    let vs = vs_arg(vs)?;
    spawn_call(env, reference, move |jobs| async move { jobs.remove_if(&job_type, &id, vs.as_ref()).await }, ok_answer)
}

#[rustler::nif]
fn job_counts<'a>(env: Env<'a>, reference: Term<'a>, job_type: Term<'a>) -> NifResult<Term<'a>> {
    let job_type = type_args(reference, job_type)?;
    spawn_call(env, reference, move |jobs| async move { jobs.counts(&job_type).await }, counts_answer)
}

#[rustler::nif]
fn job_types<'a>(env: Env<'a>, reference: Term<'a>) -> NifResult<Term<'a>> {
    check_ref(reference)?;
    spawn_call(env, reference, move |jobs| async move { jobs.job_types().await }, types_answer)
}

/// `job_list(Ref, Type, States, Limit, After)`: `States` `all` or a
/// non-empty list of state atoms; `Limit` 1..1000; `After` `undefined` or
/// the binary id the previous page ended with.
#[rustler::nif]
fn job_list<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    job_type: Term<'a>,
    states: Term<'a>,
    limit: Term<'a>,
    after: Term<'a>,
) -> NifResult<Term<'a>> {
    let job_type = type_args(reference, job_type)?;
    let states: Option<Vec<JobState>> = if states.is_list() {
        let mut out = Vec::new();
        for s in states.into_list_iterator()? {
            let name: rustler::Atom = s.decode()?;
            let name =
                JobState::ALL.into_iter().find(|st| rustler::Atom::from_str(env, st.name()).is_ok_and(|a| a == name));
            out.push(name.ok_or(Error::BadArg)?);
        }
        if out.is_empty() {
            return Err(Error::BadArg);
        }
        Some(out)
    } else if states
        .decode::<rustler::Atom>()
        .is_ok_and(|a| a == rustler::Atom::from_str(env, "all").unwrap_or(atoms::undefined()))
    {
        None
    } else {
        return Err(Error::BadArg);
    };
    let limit: usize = limit.decode().map_err(|_| Error::BadArg)?;
    if !(1..=1000).contains(&limit) {
        return Err(Error::BadArg);
    }
    let after = if after.is_binary() {
        Some(bytes_arg(after)?.to_vec())
    } else if vs_arg(after)?.is_none() {
        None
    } else {
        return Err(Error::BadArg);
    };
    spawn_call(
        env,
        reference,
        move |jobs| async move { jobs.list(&job_type, states.as_deref(), limit, after.as_deref()).await },
        |(page, cont)| page_answer(page, cont),
    )
}

#[rustler::nif]
fn job_set_paused<'a>(env: Env<'a>, reference: Term<'a>, job_type: Term<'a>, paused: Term<'a>) -> NifResult<Term<'a>> {
    let job_type = type_args(reference, job_type)?;
    let paused: bool = paused.decode()?;
    spawn_call(env, reference, move |jobs| async move { jobs.set_paused(&job_type, paused).await }, ok_answer)
}

#[rustler::nif]
fn job_cancel<'a>(env: Env<'a>, reference: Term<'a>, job_type: Term<'a>, id: Term<'a>) -> NifResult<Term<'a>> {
    let (job_type, id) = job_args(reference, job_type, id)?;
    spawn_call(env, reference, move |jobs| async move { jobs.cancel(&job_type, &id).await }, ok_answer)
}

#[rustler::nif]
fn job_remove<'a>(env: Env<'a>, reference: Term<'a>, job_type: Term<'a>, id: Term<'a>) -> NifResult<Term<'a>> {
    let (job_type, id) = job_args(reference, job_type, id)?;
    spawn_call(env, reference, move |jobs| async move { jobs.remove(&job_type, &id).await }, ok_answer)
}

#[rustler::nif]
fn job_get<'a>(env: Env<'a>, reference: Term<'a>, job_type: Term<'a>, id: Term<'a>) -> NifResult<Term<'a>> {
    let (job_type, id) = job_args(reference, job_type, id)?;
    spawn_call(
        env,
        reference,
        move |jobs| async move { jobs.get_with_history(&job_type, &id).await },
        super::types::job_with_history_answer,
    )
}

#[rustler::nif]
fn job_pending_count<'a>(env: Env<'a>, reference: Term<'a>, job_type: Term<'a>) -> NifResult<Term<'a>> {
    let job_type = type_args(reference, job_type)?;
    spawn_call(env, reference, move |jobs| async move { jobs.pending_count(&job_type).await }, reply::ok_with)
}
