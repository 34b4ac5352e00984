//! The job type settings NIFs: `job_type_get/2` and `job_type_set/3`
//! (`couch_workers:job_type_get/1`, `job_type_set/2`). A setting is a
//! positive integer or `infinity`; any other shape is `badarg`, a value
//! the core refuses (zero) `{error, Name}`. And a job's run history, as
//! the `history` of the job map `job_get/3` answers.

use couch_workers_core::job_controls::{Run, TypeSetting, TypeSettings};
use couch_workers_core::Job;
use rustler::{Encoder, Env, Error, NifResult, Term};

use super::args::type_args;
use super::spawn_call;
use super::terms::job_to_term;
use crate::atoms::{self, activity_timeout};
use crate::reply::Answer;
use crate::term::{atom, binary};

rustler::atoms! {
    max_running,
    max_running_per_group,
    infinity,
}

#[rustler::nif]
fn job_type_get<'a>(env: Env<'a>, reference: Term<'a>, job_type: Term<'a>) -> NifResult<Term<'a>> {
    let job_type = type_args(reference, job_type)?;
    spawn_call(env, reference, move |jobs| async move { jobs.type_settings(&job_type).await }, settings_answer)
}

#[rustler::nif]
fn job_type_set<'a>(env: Env<'a>, reference: Term<'a>, job_type: Term<'a>, settings: Term<'a>) -> NifResult<Term<'a>> {
    let job_type = type_args(reference, job_type)?;
    let changes = changes_arg(settings)?;
    spawn_call(
        env,
        reference,
        move |jobs| async move { jobs.set_type_settings(&job_type, &changes).await },
        settings_answer,
    )
}

/// `#{activity_timeout | max_running | max_running_per_group => pos_integer() | infinity}`.
fn changes_arg(settings: Term) -> NifResult<Vec<TypeSetting>> {
    if !settings.is_map() {
        return Err(Error::BadArg);
    }
    let mut changes = Vec::new();
    for (key, value) in rustler::types::map::MapIterator::new(settings).ok_or(Error::BadArg)? {
        let value = limit_arg(value)?;
        changes.push(if key == activity_timeout().encode(settings.get_env()) {
            TypeSetting::ActivityTimeout(value)
        } else if key == max_running().encode(settings.get_env()) {
            TypeSetting::MaxRunning(value)
        } else if key == max_running_per_group().encode(settings.get_env()) {
            TypeSetting::MaxRunningPerGroup(value)
        } else {
            return Err(Error::BadArg);
        });
    }
    Ok(changes)
}

/// `infinity` is `None`; a non-negative integer is itself (zero is the
/// core's to refuse).
fn limit_arg(value: Term) -> NifResult<Option<u64>> {
    if value.is_atom() {
        return if value == infinity().encode(value.get_env()) { Ok(None) } else { Err(Error::BadArg) };
    }
    value.decode::<u64>().map(Some).map_err(|_| Error::BadArg)
}

/// `{ok, #{activity_timeout, max_running, max_running_per_group}}`, each
/// a positive integer or `infinity`.
fn settings_answer(s: TypeSettings) -> Answer {
    Box::new(move |env| {
        let limit = |v: Option<u64>| match v {
            Some(n) => n.encode(env),
            None => infinity().encode(env),
        };
        let map = Term::map_from_pairs(
            env,
            &[
                (activity_timeout().encode(env), limit(s.activity_timeout)),
                (max_running().encode(env), limit(s.max_running)),
                (max_running_per_group().encode(env), limit(s.max_running_per_group)),
            ],
        )
        .expect("distinct keys");
        (atoms::ok(), map).encode(env)
    })
}

/// `{ok, Job}` with `history`: `[#{attempt, worker, started_at, ended_at,
/// outcome, error}]`, newest first (`ended_at`, `error` `null` when there
/// is none; `error` decoded from JSON).
pub(super) fn job_with_history_answer((job, runs): (Job, Vec<Run>)) -> Answer {
    Box::new(move |env| {
        let map = job_to_term(env, &job, None);
        let runs: Vec<Term> = runs.iter().map(|r| run_to_term(env, r)).collect();
        let map = map.map_put(atom(env, "history"), runs.encode(env)).unwrap_or(map);
        (atoms::ok(), map).encode(env)
    })
}

fn run_to_term<'a>(env: Env<'a>, r: &Run) -> Term<'a> {
    let null = || atoms::null().encode(env);
    let pairs = [
        (atom(env, "attempt"), r.attempt.encode(env)),
        (atom(env, "worker"), binary(env, &r.worker)),
        (atom(env, "started_at"), r.started_at.encode(env)),
        (atom(env, "ended_at"), r.ended_at.map_or_else(null, |t| t.encode(env))),
        (atom(env, "outcome"), atom(env, r.outcome.name())),
        (atom(env, "error"), r.error.as_deref().map_or_else(null, |e| crate::json::json_bytes_to_term(env, e))),
    ];
    Term::map_from_pairs(env, &pairs).expect("distinct keys")
}
