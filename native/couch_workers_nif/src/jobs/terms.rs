//! Jobs as Erlang terms, and the answers the job NIFs reply with.

use couch_workers_core::job_controls::ActivityTimeout;
use couch_workers_core::Error as CoreError;
use couch_workers_core::{AcceptToken, Job, JobHandle, JobState, Keep, MaxAttempts};
use rustler::{Encoder, Env, Term};

use crate::atoms;
use crate::json::json_bytes_to_term;
use crate::reply::{self, Answer};
use crate::term::{atom, binary};

/// The Erlang map of a job; with `token`, the handle of an accept.
pub fn job_to_term<'a>(env: Env<'a>, job: &Job, token: Option<&AcceptToken>) -> Term<'a> {
    let null = || atoms::null().encode(env);
    let mut keys = vec![
        atoms::type_().encode(env),
        atoms::id().encode(env),
        atoms::state().encode(env),
        atoms::worker().encode(env),
        atoms::priority().encode(env),
        atoms::info().encode(env),
        atoms::result().encode(env),
        atoms::attempts().encode(env),
        atoms::vs().encode(env),
        atoms::cancel_requested().encode(env),
        atoms::error().encode(env),
        atoms::max_attempts().encode(env),
        atoms::run_at().encode(env),
        atoms::keep().encode(env),
    ];
    let mut values = vec![
        binary(env, &job.job_type),
        binary(env, &job.id),
        atom(env, job.state.name()),
        job.worker.as_deref().map_or_else(null, |w| binary(env, w)),
        job.priority.encode(env),
        json_bytes_to_term(env, &job.info),
        job.result.as_deref().map_or_else(null, |r| json_bytes_to_term(env, r)),
        job.attempts.encode(env),
        binary(env, &job.vs),
        job.cancel_requested.encode(env),
        job.error.as_deref().map_or_else(null, |e| json_bytes_to_term(env, e)),
        match job.max_attempts {
            MaxAttempts::Limit(n) => n.encode(env),
            MaxAttempts::Infinity => atoms::infinity().encode(env),
        },
        job.run_at.map_or_else(null, |t| t.encode(env)),
        match job.keep {
            Keep::Seconds(s) => s.encode(env),
            Keep::Infinity => atoms::infinity().encode(env),
        },
    ];
    keys.push(atoms::unique().encode(env));
    values.push(job.unique.as_deref().map_or_else(null, |u| binary(env, u)));
    keys.push(atoms::group().encode(env));
    values.push(job.group.as_deref().map_or_else(null, |g| binary(env, g)));
    keys.push(atoms::activity_timeout().encode(env));
    values.push(match job.activity_timeout {
        None => null(),
        Some(ActivityTimeout::Seconds(s)) => s.encode(env),
        Some(ActivityTimeout::Infinity) => atoms::infinity().encode(env),
    });
    if let Some(token) = token {
        keys.push(atoms::token().encode(env));
        values.push(binary(env, token));
    }
    // The keys are distinct atoms: this cannot fail.
    Term::map_from_term_arrays(env, &keys, &values).unwrap_or_else(|_| rustler::types::map::map_new(env))
}

/// `ok`.
pub(super) fn ok_answer(_: ()) -> Answer {
    reply::ok()
}

pub(super) fn handle_answer(handle: JobHandle) -> Answer {
    Box::new(move |env| {
        let job = job_to_term(env, &handle.job, Some(&handle.token));
        // An accept's handle: since when the job could be accepted (the
        // telemetry's `queue_time`).
        let job = match handle.queued_at {
            Some(at) => job.map_put(atoms::queued_at().encode(env), at.encode(env)).unwrap_or(job),
            None => job,
        };
        (atoms::ok(), job).encode(env)
    })
}

/// `{error, {already_exists, [Id]}}`.
pub(super) fn already_exists_answer(ids: Vec<Vec<u8>>) -> Answer {
    Box::new(move |env| {
        let ids: Vec<Term> = ids.iter().map(|id| binary(env, id)).collect();
        (atoms::error(), (atoms::already_exists(), ids)).encode(env)
    })
}

/// `{ok, #{State => N}}`.
pub(super) fn counts_answer(counts: [(JobState, u64); 6]) -> Answer {
    Box::new(move |env| {
        let keys: Vec<Term> = counts.iter().map(|(s, _)| atom(env, s.name())).collect();
        let values: Vec<Term> = counts.iter().map(|(_, n)| n.encode(env)).collect();
        let map = Term::map_from_term_arrays(env, &keys, &values).unwrap_or_else(|_| rustler::types::map::map_new(env));
        (atoms::ok(), map).encode(env)
    })
}

/// `{ok, [Type]}`.
pub(super) fn types_answer(types: Vec<Vec<u8>>) -> Answer {
    Box::new(move |env| {
        let list: Vec<Term> = types.iter().map(|t| binary(env, t)).collect();
        (atoms::ok(), list).encode(env)
    })
}

/// `{ok, [Job], Cont}`, `Cont` the last id or `done`.
pub(super) fn page_answer(page: Vec<Job>, cont: Option<Vec<u8>>) -> Answer {
    Box::new(move |env| {
        let list: Vec<Term> = page.iter().map(|j| job_to_term(env, j, None)).collect();
        let cont = cont.map_or_else(|| atoms::done().encode(env), |c| binary(env, &c));
        (atoms::ok(), list, cont).encode(env)
    })
}

/// `{error, Name}` of a core error.
pub(super) fn core_error(e: &CoreError) -> Answer {
    match e {
        // `{error, {duplicate, HolderId}}`: the job that holds the key.
        CoreError::Duplicate(holder) => {
            let holder = holder.clone();
            Box::new(move |env| (atoms::error(), (atom(env, "duplicate"), binary(env, &holder))).encode(env))
        }
        _ => reply::error(e.name()),
    }
}
