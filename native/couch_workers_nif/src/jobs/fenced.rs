//! `job_add/4` and `job_resubmit/4` with `if_leader => {WorkerType,
//! Epoch}`: the same arguments as `job_add`/`job_resubmit` plus the
//! fence, written only while `Epoch` leads `WorkerType`, checked in the
//! writing transaction (`couch_workers_core::leaders::Leadership`); else the
//! reply is `{error, not_leader}` and nothing was written. `Fence` must be
//! a tuple of two binaries (else `badarg`).

// `job_resubmit_if_leader/7`: its Erlang arity and the environment make
// eight arguments, and the bodies take the scheduler too.
#![allow(clippy::too_many_arguments)]

use couch_workers_core::leaders::Leadership;
use rustler::types::tuple::get_tuple;
use rustler::{Env, NifResult, Term};

use super::args::{info_opts_args, job_args, vs_arg};
use super::spawn_call;
use super::terms::ok_answer;
use crate::json::{budgeted_nif, Sched};
use crate::term::bytes_arg;

/// `{WorkerType, Epoch}`; `badarg` for any other shape.
pub(crate) fn fence_arg(term: Term) -> NifResult<(Vec<u8>, Vec<u8>)> {
    let [worker_type, epoch] = get_tuple(term)?[..] else { return Err(rustler::Error::BadArg) };
    Ok((bytes_arg(worker_type)?.to_vec(), bytes_arg(epoch)?.to_vec()))
}

budgeted_nif!(job_add_if_leader, job_add_if_leader_dirty, add(reference, job_type, id, info, opts, fence));

fn add<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    job_type: Term<'a>,
    id: Term<'a>,
    info: Term<'a>,
    opts: Term<'a>,
    fence: Term<'a>,
    sched: Sched,
) -> NifResult<Term<'a>> {
    let (job_type, id) = job_args(reference, job_type, id)?;
    let (worker_type, epoch) = fence_arg(fence)?;
    let fence = Leadership::fence(&worker_type, &epoch);
    let (info, opts) = try_json!(info_opts_args(env, info, opts, sched));
    spawn_call(
        env,
        reference,
        move |jobs| async move { Leadership::new(jobs.context().clone()).add(&job_type, &id, &info, &opts, &fence).await },
        ok_answer,
    )
}

budgeted_nif!(
    job_resubmit_if_leader,
    job_resubmit_if_leader_dirty,
    resubmit(reference, job_type, id, info, opts, if_vs, fence)
);

fn resubmit<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    job_type: Term<'a>,
    id: Term<'a>,
    info: Term<'a>,
    opts: Term<'a>,
    if_vs: Term<'a>,
    fence: Term<'a>,
    sched: Sched,
) -> NifResult<Term<'a>> {
    let (job_type, id) = job_args(reference, job_type, id)?;
    let if_vs = vs_arg(if_vs)?;
    let (worker_type, epoch) = fence_arg(fence)?;
    let fence = Leadership::fence(&worker_type, &epoch);
    let (info, opts) = try_json!(info_opts_args(env, info, opts, sched));
    spawn_call(
        env,
        reference,
        move |jobs| async move {
            Leadership::new(jobs.context().clone()).resubmit(&job_type, &id, &info, &opts, if_vs.as_ref(), &fence).await
        },
        ok_answer,
    )
}
