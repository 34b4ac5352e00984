//! Job queue NIFs (the core's `JobService`, `node.jobs()`).
//!
//! Signatures, immediate answers and the `{Ref, Result}` replies of these
//! NIFs are listed once, in the `@doc` of `src/couch_workers_nif.erl` (the
//! stubs Erlang calls); this module documents what that list does not:
//! argument shapes, the immediate errors, and how accepts and
//! subscriptions keep "exactly one answer".
//!
//! Shapes (else `badarg`): `Type`, `Id` binaries; `Worker` a binary, or
//! (`job_accept/4`) a registration of `Type` (see `accept_worker`); `Info` and
//! `Result` maps; `Priority` an integer; `TimeoutMs` a non-negative
//! integer; `Handle` a map with binary `type`, `id`, `worker` and a 16-byte
//! binary `token` (what `job_accept`/`job_update` answer; a `job_get` map
//! has no token and is refused); `Pid` a local pid. Answered at once,
//! nothing written: `{error, invalid_priority}` (an integer outside i64),
//! `{error, invalid_info}` / `{error, invalid_result}` (a map JSON cannot
//! hold), `{error, value_too_large}` (its JSON over the value limit),
//! `{error, transaction_too_large}` (an `add_many` batch one transaction
//! cannot hold), `{error, not_started}`. Key limits and store errors come
//! in the reply.
//!
//! `dirty`: `Info`/`Result` has more terms than a normal scheduler may
//! convert (see `json.rs`); nothing was done, call the `_dirty` twin
//! (DirtyCpu) with the same arguments, as `couch_workers_nif:budgeted/2`
//! does. `job_add_many/3` always runs on a dirty scheduler.
//!
//! A `Job` is the map `#{type, id, state, worker, priority, info, result,
//! attempts, vs, cancel_requested}` (`state` an atom; `worker` and
//! `result` `null` when there is none; `info`/`result` decoded from JSON
//! with binary keys; `vs` 12 bytes, later changes compare greater). A
//! `Handle` is a `Job` plus `token`, the 16-byte fencing token of that
//! accept.
//!
//! ## Accept
//!
//! `job_accept/4` hands the core a reply object and returns a `Waiter`
//! resource that the caller keeps while it waits. The reply object and
//! the resource share one state, `waiting → delivered | abandoned`,
//! changed once by compare-and-swap:
//!
//! * the core's delivery moves it to `delivered` and then sends
//!   `{Ref, Outcome}`; if the state was `abandoned` it sends nothing and
//!   reports failure, so a job taken meanwhile goes back to pending (as
//!   does a job whose message could not be sent: a dead caller);
//! * `job_accept_abandon/1` (a caller giving up) and the resource's
//!   destructor (the caller died: its heap, and the resource, are freed)
//!   move it to `abandoned`; the dispatcher then drops the waiter at its
//!   next check (`is_waiting`), so dead acceptors do not linger.
//!
//! `job_accept_abandon/1` answers `delivered` when the answer was already
//! on its way: it is then in, or about to be in, the caller's mailbox.
//! No job can be lost between the two.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use couch_workers_core::jobs::{
    AcceptReply, AcceptToken, AddManyError, Fence, Job, JobEvent, JobHandle, JobOpts, JobService, JobSpec, JobState,
    JobSubscription, JobVs, Keep, MaxAttempts, Retry, Schedule,
};
use couch_workers_core::keyspace::Incarnation;
use couch_workers_core::log::{Event, Level};
use couch_workers_core::store::MAX_TRANSACTION_SIZE;
use couch_workers_core::Error as CoreError;
use rustler::types::tuple::get_tuple;
use rustler::{Encoder, Env, Error, LocalPid, NifResult, OwnedEnv, Resource, ResourceArc, Term, TermType};
use serde_json::Value;

use crate::atoms;
use crate::json::{self, budgeted_nif, json_bytes_to_term, Sched};
use crate::reply::{self, Answer, Replier};
use crate::runtime;
use crate::stats::{self, LiveResource};
use crate::term::{atom, binary, bytes_arg, error_tuple};
use crate::workers::RegistrationResource;

/// Most jobs in one `job_add_many` (the core's limit: one user version
/// per job within the commit).
const MAX_ADD_MANY: usize = 1 << 16;

// ---- resources ------------------------------------------------------------

const WAITING: u8 = 0;
const DELIVERED: u8 = 1;
const ABANDONED: u8 = 2;

/// What the caller of `job_accept/4` holds while it waits.
pub struct WaiterResource {
    state: Arc<AtomicU8>,
    _live: LiveResource,
}

#[rustler::resource_impl(register = false)]
impl Resource for WaiterResource {}

impl Drop for WaiterResource {
    fn drop(&mut self) {
        // The caller let go of it: it returned (the state is `delivered`
        // already, nothing changes) or died (nobody waits any more).
        let _ = self.state.compare_exchange(WAITING, ABANDONED, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// A live job subscription; dropping it ends the subscription.
pub struct SubscriptionResource {
    sub: JobSubscription,
    _live: LiveResource,
}

#[rustler::resource_impl(register = false)]
impl Resource for SubscriptionResource {}

pub fn load(env: Env) -> bool {
    env.register::<WaiterResource>().is_ok() && env.register::<SubscriptionResource>().is_ok()
}

// ---- terms ------------------------------------------------------------------

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
    if let Some(token) = token {
        keys.push(atoms::token().encode(env));
        values.push(binary(env, token));
    }
    // The keys are distinct atoms: this cannot fail.
    Term::map_from_term_arrays(env, &keys, &values).unwrap_or_else(|_| rustler::types::map::map_new(env))
}

fn handle_answer(handle: JobHandle) -> Answer {
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

fn job_answer(job: Job) -> Answer {
    Box::new(move |env| (atoms::ok(), job_to_term(env, &job, None)).encode(env))
}

/// `{error, {already_exists, [Id]}}`.
fn already_exists_answer(ids: Vec<Vec<u8>>) -> Answer {
    Box::new(move |env| {
        let ids: Vec<Term> = ids.iter().map(|id| binary(env, id)).collect();
        (atoms::error(), (atoms::already_exists(), ids)).encode(env)
    })
}

/// `{ok, #{State => N}}`.
fn counts_answer(counts: [(JobState, u64); 6]) -> Answer {
    Box::new(move |env| {
        let keys: Vec<Term> = counts.iter().map(|(s, _)| atom(env, s.name())).collect();
        let values: Vec<Term> = counts.iter().map(|(_, n)| n.encode(env)).collect();
        let map = Term::map_from_term_arrays(env, &keys, &values).unwrap_or_else(|_| rustler::types::map::map_new(env));
        (atoms::ok(), map).encode(env)
    })
}

/// `{ok, [Type]}`.
fn types_answer(types: Vec<Vec<u8>>) -> Answer {
    Box::new(move |env| {
        let list: Vec<Term> = types.iter().map(|t| binary(env, t)).collect();
        (atoms::ok(), list).encode(env)
    })
}

/// `{ok, [Job], Cont}`, `Cont` the last id or `done`.
fn page_answer(page: Vec<Job>, cont: Option<Vec<u8>>) -> Answer {
    Box::new(move |env| {
        let list: Vec<Term> = page.iter().map(|j| job_to_term(env, j, None)).collect();
        let cont = cont.map_or_else(|| atoms::done().encode(env), |c| binary(env, &c));
        (atoms::ok(), list, cont).encode(env)
    })
}

/// `{ok, Subscription, Job}`.
fn subscribed_answer(res: ResourceArc<SubscriptionResource>, job: Job) -> Answer {
    Box::new(move |env| (atoms::ok(), res, job_to_term(env, &job, None)).encode(env))
}

/// `{error, Name}` of a core error.
fn core_error(e: &CoreError) -> Answer {
    reply::error(e.name())
}

/// The fence of a handle map; `badarg` for anything else.
fn fence_arg(term: Term) -> NifResult<Fence> {
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
fn json_arg<'a>(
    env: Env<'a>,
    term: Term<'a>,
    sched: Sched,
    invalid: rustler::Atom,
) -> Result<Vec<u8>, NifResult<Term<'a>>> {
    let map = json::map_arg(env, term, sched, invalid, |e| {
        crate::log::emit(Event::new(Level::Debug, "invalid_job_json").with("reason", e.to_string()));
    })?;
    serde_json::to_vec(&Value::Object(map)).map_err(|_| Ok((atoms::error(), invalid).encode(env)))
}

/// A priority: an integer (else `badarg`) within i64 (else `None`).
fn priority_arg(term: Term) -> NifResult<Option<i64>> {
    if term.get_type() != TermType::Integer {
        return Err(Error::BadArg);
    }
    Ok(term.decode::<i64>().ok())
}

/// The options tuple `{Priority, Schedule, MaxAttempts, Keep}`, each
/// `undefined` when not given (`couch_workers_jobs` validates the caller's
/// map and builds it): `Schedule` `{delay, Ms}` or `{run_at, Ms}`,
/// `MaxAttempts` a positive integer or `infinity`, `Keep` a non-negative
/// integer or `infinity`. `Ok(None)`: a priority outside i64. Anything
/// else is `badarg`.
fn opts_arg(term: Term) -> NifResult<Option<JobOpts>> {
    let fields = get_tuple(term)?;
    let [priority, schedule, max_attempts, keep] = fields[..] else { return Err(Error::BadArg) };
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
        opts.keep = Some(if is_infinity(keep) { Keep::Infinity } else { Keep::Seconds(keep.decode().map_err(|_| Error::BadArg)?) });
    }
    Ok(Some(opts))
}

/// `undefined`, or a job's 12-byte `vs`.
fn vs_arg(term: Term) -> NifResult<Option<JobVs>> {
    if term.is_atom() {
        return if term.decode::<rustler::Atom>()? == atoms::undefined() { Ok(None) } else { Err(Error::BadArg) };
    }
    Ok(Some(JobVs::try_from(bytes_arg(term)?).map_err(|_| Error::BadArg)?))
}

fn check_ref(reference: Term) -> NifResult<()> {
    if reference.is_ref() {
        Ok(())
    } else {
        Err(Error::BadArg)
    }
}

/// The running node's job service and runtime, or the `{error, Name}` to
/// answer.
fn service<'a>(env: Env<'a>) -> Result<(JobService, tokio::runtime::Handle), Term<'a>> {
    match runtime::running() {
        Ok(node) => Ok((node.jobs().clone(), node.runtime().clone())),
        Err(e) => Err(error_tuple(env, e.name())),
    }
}

macro_rules! try_service {
    ($env:expr) => {
        match service($env) {
            Ok(s) => s,
            Err(answer) => return Ok(answer),
        }
    };
}

macro_rules! try_json {
    ($e:expr) => {
        match $e {
            Ok(bytes) => bytes,
            Err(answer) => return answer,
        }
    };
}

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
    check_ref(reference)?;
    let job_type = bytes_arg(job_type)?.to_vec();
    let id = bytes_arg(id)?.to_vec();
    let opts = opts_arg(opts)?;
    let info = try_json!(json_arg(env, info, sched, atoms::invalid_info()));
    let Some(opts) = opts else {
        return Ok((atoms::error(), atoms::invalid_priority()).encode(env));
    };
    let (jobs, rt) = try_service!(env);
    reply::spawn(&rt, Replier::new(env, reference), async move {
        match jobs.add_with(&job_type, &id, &info, &opts).await {
            Ok(()) => reply::ok(),
            Err(e) => core_error(&e),
        }
    });
    Ok(atoms::ok().encode(env))
}

/// Runs on a dirty scheduler: a batch converts up to 10 MB of terms to
/// JSON.
#[rustler::nif(schedule = "DirtyCpu")]
fn job_add_many<'a>(env: Env<'a>, reference: Term<'a>, job_type: Term<'a>, list: Term<'a>) -> NifResult<Term<'a>> {
    check_ref(reference)?;
    let job_type = bytes_arg(job_type)?.to_vec();
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
    let (service, rt) = try_service!(env);
    reply::spawn(&rt, Replier::new(env, reference), async move {
        match service.add_many_with(&job_type, &jobs).await {
            Ok(()) => reply::ok(),
            Err(AddManyError::AlreadyExists(ids)) => already_exists_answer(ids),
            Err(AddManyError::Error(e)) => core_error(&e),
        }
    });
    Ok(atoms::ok().encode(env))
}

// ---- accept -----------------------------------------------------------------

/// The core's reply object for one `job_accept/4`.
struct AcceptReplier {
    state: Arc<AtomicU8>,
    replier: Option<Replier>,
}

impl AcceptReply for AcceptReplier {
    fn is_waiting(&self) -> bool {
        self.state.load(Ordering::SeqCst) == WAITING
    }

    fn deliver(mut self: Box<Self>, outcome: Result<JobHandle, CoreError>) -> bool {
        let Some(replier) = self.replier.take() else { return false };
        if self.state.compare_exchange(WAITING, DELIVERED, Ordering::SeqCst, Ordering::SeqCst).is_err() {
            // Abandoned: nobody waits for this answer.
            replier.discard();
            return false;
        }
        let answer = match outcome {
            Ok(handle) => handle_answer(handle),
            Err(e) => core_error(&e),
        };
        if rustler::thread::is_scheduler_thread() {
            // Not reached (the NIF calls `accept_with` on the runtime), but
            // an OwnedEnv cannot send from here: hand the send over. Only
            // an error could be delivered synchronously.
            if let Some(rt) = runtime::handle() {
                rt.spawn(async move { replier.send(answer) });
            }
            return true;
        }
        replier.send_checked(answer)
    }
}

impl Drop for AcceptReplier {
    fn drop(&mut self) {
        // Dropped unanswered: the waiter was abandoned (no answer is
        // wanted) or the service stopped without answering (the replier
        // answers `{error, dropped}` itself).
        if let Some(replier) = self.replier.take() {
            if self.state.load(Ordering::SeqCst) == ABANDONED {
                replier.discard();
            }
        }
    }
}

/// The worker an accept is for: an id (whichever registration holds it),
/// or a registration of `worker_type` (its id, and only while its
/// incarnation holds the id: a caller still waiting after it ended takes
/// nothing of a later registration's).
fn accept_worker(worker: Term<'_>, worker_type: &[u8]) -> NifResult<(Vec<u8>, Option<Incarnation>)> {
    if let Ok(id) = bytes_arg(worker) {
        return Ok((id.to_vec(), None));
    }
    let resource: ResourceArc<RegistrationResource> = worker.decode().map_err(|_| Error::BadArg)?;
    let reg = resource.registration();
    if reg.spec().worker_type != worker_type {
        return Err(Error::BadArg);
    }
    Ok((reg.spec().id.clone(), Some(*reg.incarnation())))
}

#[rustler::nif]
fn job_accept<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    worker_type: Term<'a>,
    worker: Term<'a>,
    timeout_ms: Term<'a>,
) -> NifResult<Term<'a>> {
    check_ref(reference)?;
    let worker_type = bytes_arg(worker_type)?.to_vec();
    let (worker, incarnation) = accept_worker(worker, &worker_type)?;
    let timeout_ms: u64 = timeout_ms.decode().map_err(|_| Error::BadArg)?;
    let (jobs, rt) = try_service!(env);
    let state = Arc::new(AtomicU8::new(WAITING));
    let waiter = ResourceArc::new(WaiterResource { state: state.clone(), _live: LiveResource::new(&stats::ACCEPT_WAITERS) });
    let replier = AcceptReplier { state, replier: Some(Replier::new(env, reference)) };
    // On the runtime, so that every delivery (also an immediate error)
    // happens off the schedulers.
    rt.spawn(async move {
        jobs.accept_registered_with(worker_type, worker, incarnation, Duration::from_millis(timeout_ms), Box::new(replier));
    });
    Ok((atoms::ok(), waiter).encode(env))
}

#[rustler::nif]
fn job_accept_abandon<'a>(env: Env<'a>, waiter: Term<'a>) -> NifResult<Term<'a>> {
    let waiter: ResourceArc<WaiterResource> = waiter.decode().map_err(|_| Error::BadArg)?;
    match waiter.state.compare_exchange(WAITING, ABANDONED, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(_) => Ok(atoms::abandoned().encode(env)),
        Err(ABANDONED) => Ok(atoms::abandoned().encode(env)),
        Err(_) => Ok(atoms::delivered().encode(env)),
    }
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
    check_ref(reference)?;
    let fence = fence_arg(handle)?;
    let info = try_json!(json_arg(env, info, sched, atoms::invalid_info()));
    let (jobs, rt) = try_service!(env);
    reply::spawn(&rt, Replier::new(env, reference), async move {
        match jobs.update(&fence, &info).await {
            Ok(handle) => handle_answer(handle),
            Err(e) => core_error(&e),
        }
    });
    Ok(atoms::ok().encode(env))
}

budgeted_nif!(job_finish, job_finish_dirty, finish(reference, handle, result));

fn finish<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    handle: Term<'a>,
    result: Term<'a>,
    sched: Sched,
) -> NifResult<Term<'a>> {
    check_ref(reference)?;
    let fence = fence_arg(handle)?;
    let result = try_json!(json_arg(env, result, sched, atoms::invalid_result()));
    let (jobs, rt) = try_service!(env);
    reply::spawn(&rt, Replier::new(env, reference), async move {
        match jobs.finish(&fence, &result).await {
            Ok(()) => reply::ok(),
            Err(e) => core_error(&e),
        }
    });
    Ok(atoms::ok().encode(env))
}

budgeted_nif!(job_fail, job_fail_dirty, fail(reference, handle, error, retry));

/// `Retry`: `false` (no retry), `{delay, Ms}`, or `{backoff, BaseMs, MaxMs}`.
fn retry_arg(term: Term) -> NifResult<Retry> {
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

fn fail<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    handle: Term<'a>,
    error: Term<'a>,
    retry: Term<'a>,
    sched: Sched,
) -> NifResult<Term<'a>> {
    check_ref(reference)?;
    let fence = fence_arg(handle)?;
    let retry = retry_arg(retry)?;
    let error = try_json!(json_arg(env, error, sched, atoms::invalid_info()));
    let (jobs, rt) = try_service!(env);
    reply::spawn(&rt, Replier::new(env, reference), async move {
        match jobs.fail(&fence, &error, retry).await {
            Ok(()) => reply::ok(),
            Err(e) => core_error(&e),
        }
    });
    Ok(atoms::ok().encode(env))
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
    check_ref(reference)?;
    let fence = fence_arg(handle)?;
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
    let (jobs, rt) = try_service!(env);
    reply::spawn(&rt, Replier::new(env, reference), async move {
        match jobs.release(&fence, &opts, info.as_deref()).await {
            Ok(()) => reply::ok(),
            Err(e) => core_error(&e),
        }
    });
    Ok(atoms::ok().encode(env))
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
    check_ref(reference)?;
    let job_type = bytes_arg(job_type)?.to_vec();
    let id = bytes_arg(id)?.to_vec();
    let opts = opts_arg(opts)?;
    let if_vs = vs_arg(if_vs)?;
    let info = try_json!(json_arg(env, info, sched, atoms::invalid_info()));
    let Some(opts) = opts else {
        return Ok((atoms::error(), atoms::invalid_priority()).encode(env));
    };
    let (jobs, rt) = try_service!(env);
    reply::spawn(&rt, Replier::new(env, reference), async move {
        match jobs.resubmit(&job_type, &id, &info, &opts, if_vs.as_ref()).await {
            Ok(()) => reply::ok(),
            Err(e) => core_error(&e),
        }
    });
    Ok(atoms::ok().encode(env))
}

// ---- anyone's side: cancel, remove, get, count --------------------------------

#[rustler::nif]
fn job_remove_if<'a>(env: Env<'a>, reference: Term<'a>, job_type: Term<'a>, id: Term<'a>, vs: Term<'a>) -> NifResult<Term<'a>> {
    check_ref(reference)?;
    let job_type = bytes_arg(job_type)?.to_vec();
    let id = bytes_arg(id)?.to_vec();
    let vs = vs_arg(vs)?;
    let (jobs, rt) = try_service!(env);
    reply::spawn(&rt, Replier::new(env, reference), async move {
        match jobs.remove_if(&job_type, &id, vs.as_ref()).await {
            Ok(()) => reply::ok(),
            Err(e) => core_error(&e),
        }
    });
    Ok(atoms::ok().encode(env))
}

#[rustler::nif]
fn job_counts<'a>(env: Env<'a>, reference: Term<'a>, job_type: Term<'a>) -> NifResult<Term<'a>> {
    check_ref(reference)?;
    let job_type = bytes_arg(job_type)?.to_vec();
    let (jobs, rt) = try_service!(env);
    reply::spawn(&rt, Replier::new(env, reference), async move {
        match jobs.counts(&job_type).await {
            Ok(counts) => counts_answer(counts),
            Err(e) => core_error(&e),
        }
    });
    Ok(atoms::ok().encode(env))
}

#[rustler::nif]
fn job_types<'a>(env: Env<'a>, reference: Term<'a>) -> NifResult<Term<'a>> {
    check_ref(reference)?;
    let (jobs, rt) = try_service!(env);
    reply::spawn(&rt, Replier::new(env, reference), async move {
        match jobs.job_types().await {
            Ok(types) => types_answer(types),
            Err(e) => core_error(&e),
        }
    });
    Ok(atoms::ok().encode(env))
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
    check_ref(reference)?;
    let job_type = bytes_arg(job_type)?.to_vec();
    let states: Option<Vec<JobState>> = if states.is_list() {
        let mut out = Vec::new();
        for s in states.into_list_iterator()? {
            let name: rustler::Atom = s.decode()?;
            let name = JobState::ALL.into_iter().find(|st| rustler::Atom::from_str(env, st.name()).is_ok_and(|a| a == name));
            out.push(name.ok_or(Error::BadArg)?);
        }
        if out.is_empty() {
            return Err(Error::BadArg);
        }
        Some(out)
    } else if states.decode::<rustler::Atom>().is_ok_and(|a| a == rustler::Atom::from_str(env, "all").unwrap_or(atoms::undefined())) {
        None
    } else {
        return Err(Error::BadArg);
    };
    let limit: usize = limit.decode().map_err(|_| Error::BadArg)?;
    if !(1..=1000).contains(&limit) {
        return Err(Error::BadArg);
    }
    let after = if after.is_binary() { Some(bytes_arg(after)?.to_vec()) } else if vs_arg(after)?.is_none() { None } else { return Err(Error::BadArg) };
    let (jobs, rt) = try_service!(env);
    reply::spawn(&rt, Replier::new(env, reference), async move {
        match jobs.list(&job_type, states.as_deref(), limit, after.as_deref()).await {
            Ok((page, cont)) => page_answer(page, cont),
            Err(e) => core_error(&e),
        }
    });
    Ok(atoms::ok().encode(env))
}

#[rustler::nif]
fn job_set_paused<'a>(env: Env<'a>, reference: Term<'a>, job_type: Term<'a>, paused: Term<'a>) -> NifResult<Term<'a>> {
    check_ref(reference)?;
    let job_type = bytes_arg(job_type)?.to_vec();
    let paused: bool = paused.decode()?;
    let (jobs, rt) = try_service!(env);
    reply::spawn(&rt, Replier::new(env, reference), async move {
        match jobs.set_paused(&job_type, paused).await {
            Ok(()) => reply::ok(),
            Err(e) => core_error(&e),
        }
    });
    Ok(atoms::ok().encode(env))
}


#[rustler::nif]
fn job_cancel<'a>(env: Env<'a>, reference: Term<'a>, job_type: Term<'a>, id: Term<'a>) -> NifResult<Term<'a>> {
    check_ref(reference)?;
    let job_type = bytes_arg(job_type)?.to_vec();
    let id = bytes_arg(id)?.to_vec();
    let (jobs, rt) = try_service!(env);
    reply::spawn(&rt, Replier::new(env, reference), async move {
        match jobs.cancel(&job_type, &id).await {
            Ok(()) => reply::ok(),
            Err(e) => core_error(&e),
        }
    });
    Ok(atoms::ok().encode(env))
}

#[rustler::nif]
fn job_remove<'a>(env: Env<'a>, reference: Term<'a>, job_type: Term<'a>, id: Term<'a>) -> NifResult<Term<'a>> {
    check_ref(reference)?;
    let job_type = bytes_arg(job_type)?.to_vec();
    let id = bytes_arg(id)?.to_vec();
    let (jobs, rt) = try_service!(env);
    reply::spawn(&rt, Replier::new(env, reference), async move {
        match jobs.remove(&job_type, &id).await {
            Ok(()) => reply::ok(),
            Err(e) => core_error(&e),
        }
    });
    Ok(atoms::ok().encode(env))
}

#[rustler::nif]
fn job_get<'a>(env: Env<'a>, reference: Term<'a>, job_type: Term<'a>, id: Term<'a>) -> NifResult<Term<'a>> {
    check_ref(reference)?;
    let job_type = bytes_arg(job_type)?.to_vec();
    let id = bytes_arg(id)?.to_vec();
    let (jobs, rt) = try_service!(env);
    reply::spawn(&rt, Replier::new(env, reference), async move {
        match jobs.get(&job_type, &id).await {
            Ok(job) => job_answer(job),
            Err(e) => core_error(&e),
        }
    });
    Ok(atoms::ok().encode(env))
}

#[rustler::nif]
fn job_pending_count<'a>(env: Env<'a>, reference: Term<'a>, job_type: Term<'a>) -> NifResult<Term<'a>> {
    check_ref(reference)?;
    let job_type = bytes_arg(job_type)?.to_vec();
    let (jobs, rt) = try_service!(env);
    reply::spawn(&rt, Replier::new(env, reference), async move {
        match jobs.pending_count(&job_type).await {
            Ok(n) => reply::ok_with(n),
            Err(e) => core_error(&e),
        }
    });
    Ok(atoms::ok().encode(env))
}

// ---- subscriptions ------------------------------------------------------------

/// Sends the messages of one subscription.
struct Notifier {
    /// The subscriber.
    pid: LocalPid,
    /// The subscription's reference in the external term format (terms do
    /// not outlive their environment).
    tag: Vec<u8>,
}

impl Notifier {
    fn tag<'a>(&self, env: Env<'a>) -> Term<'a> {
        env.binary_to_term(&self.tag).map(|(t, _)| t).unwrap_or_else(|| atoms::undefined().encode(env))
    }

    fn notify(&self, event: &JobEvent) {
        let mut env = OwnedEnv::new();
        match event {
            JobEvent::Changed(job) => {
                let _ = env.send_and_clear(&self.pid, |env| {
                    (atoms::couch_workers_job(), self.tag(env), job_to_term(env, job, None)).encode(env)
                });
            }
            JobEvent::Removed => {
                let _ = env
                    .send_and_clear(&self.pid, |env| (atoms::couch_workers_job(), self.tag(env), atoms::removed()).encode(env));
                // To the server registered now, not the one that
                // subscribed: it may have crashed and been restarted
                // since, taking this subscription over.
                if let Some(server) = env.run(|env| env.whereis_pid(atoms::couch_workers_jobs_subs())) {
                    let _ =
                        env.send_and_clear(&server, |env| (atoms::couch_workers_job_ended(), self.tag(env)).encode(env));
                }
            }
        }
    }
}

#[rustler::nif]
fn job_subscribe<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    job_type: Term<'a>,
    id: Term<'a>,
    pid: Term<'a>,
    sub_ref: Term<'a>,
) -> NifResult<Term<'a>> {
    check_ref(reference)?;
    check_ref(sub_ref)?;
    let job_type = bytes_arg(job_type)?.to_vec();
    let id = bytes_arg(id)?.to_vec();
    let pid: LocalPid = pid.decode().map_err(|_| Error::BadArg)?;
    let (jobs, rt) = try_service!(env);
    let notifier = Arc::new(Notifier { pid, tag: sub_ref.to_binary().as_slice().to_vec() });
    let on_event = Box::new(move |event: JobEvent| {
        // Called on a runtime thread, under the watcher's lock: send and
        // return. A panic must not take the watcher down.
        if rustler::thread::is_scheduler_thread() {
            let n = notifier.clone();
            if let Some(rt) = runtime::handle() {
                rt.spawn(async move { n.notify(&event) });
            }
            return;
        }
        if std::panic::catch_unwind(AssertUnwindSafe(|| notifier.notify(&event))).is_err() {
            crate::log::emit(Event::new(Level::Error, "job_notify_failed"));
        }
    });
    reply::spawn(&rt, Replier::new(env, reference), async move {
        match jobs.subscribe(&job_type, &id, on_event).await {
            Ok((job, sub)) => {
                let res = ResourceArc::new(SubscriptionResource { sub, _live: LiveResource::new(&stats::JOB_SUBSCRIPTIONS) });
                subscribed_answer(res, job)
            }
            Err(e) => core_error(&e),
        }
    });
    Ok(atoms::ok().encode(env))
}

#[rustler::nif]
fn job_unsubscribe<'a>(env: Env<'a>, sub: Term<'a>) -> NifResult<Term<'a>> {
    let sub: ResourceArc<SubscriptionResource> = sub.decode().map_err(|_| Error::BadArg)?;
    sub.sub.cancel();
    Ok(atoms::ok().encode(env))
}
