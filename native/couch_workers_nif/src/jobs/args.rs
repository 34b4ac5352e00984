//! The arguments of the job NIFs: shapes checked on the calling scheduler
//! (`badarg` for a wrong one), values that are answered at once.

use couch_workers_core::job_controls::ActivityTimeout;
use couch_workers_core::log_event;
use couch_workers_core::Logger;
use couch_workers_core::{AcceptToken, Fence, JobOpts, JobVs, Keep, MaxAttempts, Retry, Schedule};
use rustler::types::tuple::get_tuple;
use rustler::{Encoder, Env, Error, NifResult, Term, TermType};
use serde_json::Value;

use crate::atoms;
use crate::json::{self, Sched};
use crate::term::bytes_arg;

/// The fence of a handle map; `badarg` for anything else.
pub(super) fn fence_arg(term: Term) -> NifResult<Fence> {
    if !term.is_map() {
        return Err(Error::BadArg);
    }
    let field = |key: rustler::Atom| -> NifResult<Vec<u8>> { Ok(bytes_arg(term.map_get(key)?)?.to_vec()) };
    let token = field(atoms::token())?;
    let token = AcceptToken::try_from(token.as_slice()).map_err(|_| Error::BadArg)?;
    Ok(Fence { job_type: field(atoms::type_())?, job_id: field(atoms::id())?, worker: field(atoms::worker())?, token })
}

/// An info or result map as JSON bytes. `Err(Ok(term))`: the answer to
/// give at once (`dirty` among them, see `json::map_arg`);
/// `Err(Err(badarg))`: not a map.
pub(super) fn json_arg<'a>(
    env: Env<'a>,
    term: Term<'a>,
    sched: Sched,
    invalid: rustler::Atom,
) -> Result<Vec<u8>, NifResult<Term<'a>>> {
    let map = json::map_arg(env, term, sched, invalid, |e| {
        log_event!(Logger::PROCESS, Debug, "invalid_job_json", reason = %e);
    })?;
    serde_json::to_vec(&Value::Object(map)).map_err(|_| Ok((atoms::error(), invalid).encode(env)))
}

/// A priority: an integer (else `badarg`) within i64 (else `None`).
pub(super) fn priority_arg(term: Term) -> NifResult<Option<i64>> {
    if term.get_type() != TermType::Integer {
        return Err(Error::BadArg);
    }
    Ok(term.decode::<i64>().ok())
}

/// The options tuple `{Priority, Schedule, MaxAttempts, Keep}`, each
/// `undefined` when not given (`couch_workers_jobs` validates the caller's
/// map and builds it): `Schedule` `{delay, Ms}` or `{run_at, Ms}`,
/// `MaxAttempts` a positive integer or `infinity`, `Keep` a non-negative
/// integer or `infinity`; or `{Priority, Schedule, MaxAttempts, Keep,
/// Unique}`, `Unique` a binary (the job's unique key) or `undefined`; or
/// `{.., Unique, Group, ActivityTimeout}`, `Group` a binary,
/// `ActivityTimeout` a positive integer (seconds) or `infinity`, each or
/// `undefined`.
/// `Ok(None)`: a priority outside i64. Anything
/// else is `badarg`.
pub(super) fn opts_arg(term: Term) -> NifResult<Option<JobOpts>> {
    let fields = get_tuple(term)?;
    // `Unique`, `Group` and `ActivityTimeout` (each a value or
    // `undefined`) when given.
    let (priority, schedule, max_attempts, keep, unique, group, timeout) = match fields[..] {
        [p, s, m, k] => (p, s, m, k, None, None, None),
        [p, s, m, k, u] => (p, s, m, k, Some(u), None, None),
        [p, s, m, k, u, g, t] => (p, s, m, k, Some(u), Some(g), Some(t)),
        _ => return Err(Error::BadArg),
    };
    let given = |t: Term| !(t.is_atom() && t.decode::<rustler::Atom>().is_ok_and(|a| a == atoms::undefined()));
    let is_infinity = |t: Term| t.is_atom() && t.decode::<rustler::Atom>().is_ok_and(|a| a == atoms::infinity());
    let mut opts = JobOpts::default();
    if given(priority) {
        match priority_arg(priority)? {
            Some(p) => opts.priority = Some(p),
            None => return Ok(None),
        }
    }
    if given(schedule) {
        let sched = get_tuple(schedule)?;
        let [kind, ms] = sched[..] else { return Err(Error::BadArg) };
        let ms: u64 = ms.decode().map_err(|_| Error::BadArg)?;
        let kind: rustler::Atom = kind.decode()?;
        opts.schedule = Some(if kind == atoms::delay() {
            Schedule::Delay(ms)
        } else if kind == atoms::run_at() {
            Schedule::RunAt(ms)
        } else {
            return Err(Error::BadArg);
        });
    }
    if given(max_attempts) {
        opts.max_attempts = Some(if is_infinity(max_attempts) {
            MaxAttempts::Infinity
        } else {
            match max_attempts.decode::<u64>() {
                Ok(n) if n > 0 => MaxAttempts::Limit(n),
                _ => return Err(Error::BadArg),
            }
        });
    }
    if given(keep) {
        opts.keep = Some(if is_infinity(keep) {
            Keep::Infinity
        } else {
            Keep::Seconds(keep.decode().map_err(|_| Error::BadArg)?)
        });
    }
    if let Some(unique) = unique.filter(|u| given(*u)) {
        opts.unique = Some(bytes_arg(unique)?.to_vec());
    }
    if let Some(group) = group.filter(|g| given(*g)) {
        opts.group = Some(bytes_arg(group)?.to_vec());
    }
    if let Some(timeout) = timeout.filter(|t| given(*t)) {
        opts.activity_timeout = Some(if is_infinity(timeout) {
            ActivityTimeout::Infinity
        } else {
            match timeout.decode::<u64>() {
                Ok(n) if n > 0 => ActivityTimeout::Seconds(n),
                _ => return Err(Error::BadArg),
            }
        });
    }
    Ok(Some(opts))
}

/// `undefined`, or a job's 12-byte `vs`.
pub(super) fn vs_arg(term: Term) -> NifResult<Option<JobVs>> {
    if term.is_atom() {
        return if term.decode::<rustler::Atom>()? == atoms::undefined() { Ok(None) } else { Err(Error::BadArg) };
    }
    Ok(Some(JobVs::try_from(bytes_arg(term)?).map_err(|_| Error::BadArg)?))
}

/// The job a per-job NIF names, `(Type, Id)`: binaries (else `badarg`),
/// checked after the NIF's reference, as every NIF checks it first.
pub(super) fn job_args(reference: Term, job_type: Term, id: Term) -> NifResult<(Vec<u8>, Vec<u8>)> {
    check_ref(reference)?;
    Ok((bytes_arg(job_type)?.to_vec(), bytes_arg(id)?.to_vec()))
}

/// The `Type` of a per-type NIF, after its reference.
pub(super) fn type_args(reference: Term, job_type: Term) -> NifResult<Vec<u8>> {
    check_ref(reference)?;
    Ok(bytes_arg(job_type)?.to_vec())
}

/// The handle of a worker-side NIF (update, finish, fail, release), after
/// its reference.
pub(super) fn handle_args(reference: Term, handle: Term) -> NifResult<Fence> {
    check_ref(reference)?;
    fence_arg(handle)
}

/// The handle and result of a finish (`job_finish`, `job_finish_accept`),
/// after the reference: `badarg` for a wrong shape, or `Err(Ok(term))`,
/// the answer to give at once (see `json_arg`).
pub(super) fn finish_args<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    handle: Term<'a>,
    result: Term<'a>,
    sched: Sched,
) -> Result<(Fence, Vec<u8>), NifResult<Term<'a>>> {
    let fence = handle_args(reference, handle).map_err(Err)?;
    Ok((fence, json_arg(env, result, sched, atoms::invalid_result())?))
}

pub(super) fn check_ref(reference: Term) -> NifResult<()> {
    if reference.is_ref() {
        Ok(())
    } else {
        Err(Error::BadArg)
    }
}

/// `Retry`: `false` (no retry), `{delay, Ms}`, or `{backoff, BaseMs, MaxMs}`.
pub(super) fn retry_arg(term: Term) -> NifResult<Retry> {
    if term.is_atom() {
        return if term.decode::<bool>()? { Err(Error::BadArg) } else { Ok(Retry::No) };
    }
    let fields = get_tuple(term)?;
    match fields[..] {
        [kind, ms] if kind.decode::<rustler::Atom>()? == atoms::delay() => Ok(Retry::After(ms.decode()?)),
        [kind, base, max] if kind.decode::<rustler::Atom>()? == atoms::backoff() => {
            Ok(Retry::Backoff { base_ms: base.decode()?, max_ms: max.decode()? })
        }
        _ => Err(Error::BadArg),
    }
}
