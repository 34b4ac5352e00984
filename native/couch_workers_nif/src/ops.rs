//! Operations NIFs: the store-wide reads of `couch_workers:worker_types/0`
//! and `workers/1` and a job type's paused flag for the status page (the
//! core's `inspect.rs`), and the counters of the
//! store's retry loop for `metrics/0` (the core's `metrics.rs`).
//! Signatures and replies are listed in `src/couch_workers_nif.erl`.
//!
//! `ops_workers/2` answers a list of maps `#{id, opts, timeout,
//! heartbeat_age_ms, running}` (`timeout` and `heartbeat_age_ms` are
//! `null` for a worker whose health record is missing or unreadable);
//! replies are built on a runtime thread, never on a scheduler, so 10,000
//! workers cost the caller's scheduler nothing. `ops_store_counters/0`
//! only loads six atomics (the last two: the supervisor's restarts,
//! `services_restarted` and `services_failing`).

use couch_workers_core::WorkerInfo;
use couch_workers_core::{SERVICES, STORE};
use rustler::{Encoder, Env, Error, NifResult, Term};

use crate::atoms;
use crate::json::json_bytes_to_term;
use crate::reply::{self, Replier};
use crate::runtime;
use crate::term::{binary, bytes_arg, error_tuple};

rustler::atoms! {
    opts,
    heartbeat_age_ms,
    transactions,
    conflicts,
    retries,
    failures,
    services_restarted,
    services_failing,
}

fn worker_term<'a>(env: Env<'a>, w: &WorkerInfo) -> Term<'a> {
    let null = atoms::null().encode(env);
    let pairs = [
        (atoms::id().encode(env), binary(env, &w.id)),
        (opts().encode(env), json_bytes_to_term(env, &w.options_json)),
        (atoms::timeout().encode(env), w.timeout_s.map_or(null, |t| t.encode(env))),
        (heartbeat_age_ms().encode(env), w.heartbeat_age_ms.map_or(null, |a| a.encode(env))),
        (atoms::running().encode(env), w.running.encode(env)),
    ];
    let (keys, values): (Vec<Term>, Vec<Term>) = pairs.into_iter().unzip();
    Term::map_from_term_arrays(env, &keys, &values).unwrap_or(null)
}

#[rustler::nif]
fn ops_worker_types<'a>(env: Env<'a>, reference: Term<'a>) -> NifResult<Term<'a>> {
    if !reference.is_ref() {
        return Err(Error::BadArg);
    }
    let node = match runtime::running() {
        Ok(node) => node,
        Err(e) => return Ok(error_tuple(env, e.name())),
    };
    let rt = node.runtime().clone();
    reply::spawn(&rt, Replier::new(env, reference), async move {
        let answer: reply::Answer = match node.context().worker_types().await {
            Ok(types) => Box::new(move |env| {
                let list: Vec<Term> = types.iter().map(|t| binary(env, t)).collect();
                (atoms::ok(), list).encode(env)
            }),
            Err(e) => reply::error(e.name()),
        };
        answer
    });
    Ok(atoms::ok().encode(env))
}

#[rustler::nif]
fn ops_workers<'a>(env: Env<'a>, reference: Term<'a>, worker_type: Term<'a>) -> NifResult<Term<'a>> {
    if !reference.is_ref() {
        return Err(Error::BadArg);
    }
    let worker_type = bytes_arg(worker_type)?.to_vec();
    let node = match runtime::running() {
        Ok(node) => node,
        Err(e) => return Ok(error_tuple(env, e.name())),
    };
    let rt = node.runtime().clone();
    reply::spawn(&rt, Replier::new(env, reference), async move {
        let answer: reply::Answer = match node.context().workers(&worker_type).await {
            Ok(workers) => Box::new(move |env| {
                let list: Vec<Term> = workers.iter().map(|w| worker_term(env, w)).collect();
                (atoms::ok(), list).encode(env)
            }),
            Err(e) => reply::error(e.name()),
        };
        answer
    });
    Ok(atoms::ok().encode(env))
}

#[rustler::nif]
fn ops_job_paused<'a>(env: Env<'a>, reference: Term<'a>, job_type: Term<'a>) -> NifResult<Term<'a>> {
    if !reference.is_ref() {
        return Err(Error::BadArg);
    }
    let job_type = bytes_arg(job_type)?.to_vec();
    let node = match runtime::running() {
        Ok(node) => node,
        Err(e) => return Ok(error_tuple(env, e.name())),
    };
    let rt = node.runtime().clone();
    reply::spawn(&rt, Replier::new(env, reference), async move {
        let answer: reply::Answer = match node.context().job_paused(&job_type).await {
            Ok(paused) => Box::new(move |env| (atoms::ok(), paused).encode(env)),
            Err(e) => reply::error(e.name()),
        };
        answer
    });
    Ok(atoms::ok().encode(env))
}

#[rustler::nif]
fn ops_store_counters(env: Env) -> NifResult<Term> {
    let c = STORE.snapshot();
    let s = SERVICES.snapshot();
    let pairs = [
        (transactions().encode(env), c.transactions.encode(env)),
        (conflicts().encode(env), c.conflicts.encode(env)),
        (retries().encode(env), c.retries.encode(env)),
        (failures().encode(env), c.failures.encode(env)),
        (services_restarted().encode(env), s.restarted.encode(env)),
        (services_failing().encode(env), s.failing.encode(env)),
    ];
    let (keys, values): (Vec<Term>, Vec<Term>) = pairs.into_iter().unzip();
    Term::map_from_term_arrays(env, &keys, &values)
}
