//! Job queue NIFs (the core's `JobService`, `node.jobs()`).
//!
//! Signatures, immediate answers and the `{Ref, Result}` replies of these
//! NIFs are listed once, in the `@doc` of `src/couch_workers_nif.erl` (the
//! stubs Erlang calls); this module documents what that list does not:
//! argument shapes, the immediate errors, and how accepts and
//! subscriptions keep "exactly one answer".
//!
//! Shapes (else `badarg`): `Type`, `Id`, `Worker` binaries; `Info` and
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
    AcceptReply, AcceptToken, AddManyError, Fence, Job, JobEvent, JobHandle, JobService, JobSubscription, NewJob,
};
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
use crate::stats::{self, Live};
use crate::term::{atom, binary, bytes_arg, error_tuple};

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
    _live: Live,
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
    _live: Live,
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
    ];
    if let Some(token) = token {
        keys.push(atoms::token().encode(env));
        values.push(binary(env, token));
    }
    // The keys are distinct atoms: this cannot fail.
    Term::map_from_term_arrays(env, &keys, &values).unwrap_or_else(|_| rustler::types::map::map_new(env))
}

fn handle_answer(handle: JobHandle) -> Answer {
    Box::new(move |env| (atoms::ok(), job_to_term(env, &handle.job, Some(&handle.token))).encode(env))
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

budgeted_nif!(job_add, job_add_dirty, add(reference, job_type, id, info, priority));

fn add<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    job_type: Term<'a>,
    id: Term<'a>,
    info: Term<'a>,
    priority: Term<'a>,
    sched: Sched,
) -> NifResult<Term<'a>> {
    check_ref(reference)?;
    let job_type = bytes_arg(job_type)?.to_vec();
    let id = bytes_arg(id)?.to_vec();
    let priority = priority_arg(priority)?;
    let info = try_json!(json_arg(env, info, sched, atoms::invalid_info()));
    let Some(priority) = priority else {
        return Ok((atoms::error(), atoms::invalid_priority()).encode(env));
    };
    let (jobs, rt) = try_service!(env);
    reply::spawn(&rt, Replier::new(env, reference), async move {
        match jobs.add(&job_type, &id, &info, priority).await {
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
        let [id, info, priority] = fields[..] else { return Err(Error::BadArg) };
        if !info.is_map() {
            return Err(Error::BadArg);
        }
        items.push((bytes_arg(id)?, info, priority_arg(priority)?));
    }
    // The whole batch must fit one transaction (the core refuses it
    // otherwise): stop converting as soon as it cannot.
    let mut total = 0usize;
    let mut jobs = Vec::with_capacity(len);
    for (id, info, priority) in items {
        let info = try_json!(json_arg(env, info, Sched::Dirty, atoms::invalid_info()));
        let Some(priority) = priority else {
            return Ok((atoms::error(), atoms::invalid_priority()).encode(env));
        };
        total += info.len() + id.len();
        if total > MAX_TRANSACTION_SIZE {
            return Ok((atoms::error(), atoms::transaction_too_large()).encode(env));
        }
        jobs.push(NewJob { id: id.to_vec(), info, priority });
    }
    let (service, rt) = try_service!(env);
    reply::spawn(&rt, Replier::new(env, reference), async move {
        match service.add_many(&job_type, &jobs).await {
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
    let worker = bytes_arg(worker)?.to_vec();
    let timeout_ms: u64 = timeout_ms.decode().map_err(|_| Error::BadArg)?;
    let (jobs, rt) = try_service!(env);
    let state = Arc::new(AtomicU8::new(WAITING));
    let waiter = ResourceArc::new(WaiterResource { state: state.clone(), _live: Live::new(&stats::ACCEPT_WAITERS) });
    let replier = AcceptReplier { state, replier: Some(Replier::new(env, reference)) };
    // On the runtime, so that every delivery (also an immediate error)
    // happens off the schedulers.
    rt.spawn(async move {
        jobs.accept_with(worker_type, worker, Duration::from_millis(timeout_ms), Box::new(replier));
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

// ---- anyone's side: cancel, remove, get, count --------------------------------

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
    /// The process that made the subscription (told when it ends).
    owner: LocalPid,
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
                let _ =
                    env.send_and_clear(&self.owner, |env| (atoms::couch_workers_job_ended(), self.tag(env)).encode(env));
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
    let notifier = Arc::new(Notifier { pid, owner: env.pid(), tag: sub_ref.to_binary().as_slice().to_vec() });
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
                let res = ResourceArc::new(SubscriptionResource { sub, _live: Live::new(&stats::JOB_SUBSCRIPTIONS) });
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
