//! Job calls inside the caller's erlfdb transaction: `job_tx_add/6`,
//! `job_tx_update/4`, `job_tx_finish/4`, `job_tx_resubmit/7` (each with a
//! `_dirty` twin), `job_tx_get/4`, `job_tx_remove/5`, `job_tx_cancel/4`,
//! each with the attempt's `Session` (`job_tx_session/1`) after its `Ref`;
//! `job_tx_answer/3` (and `_dirty`), `job_tx_close/1`; the test hook
//! `test_tx_call/0`.
//!
//! The core runs the call on a forwarding transaction
//! (`couch_workers_core::caller_tx::TxJobs`); this module relays its
//! requests to the calling process as `{Ref, Seq, Request}` (Seq 0, 1, 2,
//! ...: the process performs them in that order on its erlfdb transaction,
//! whatever order the messages arrive in), takes each read's answer back
//! through `job_tx_answer(Call, Seq, Answer)`, and ends with `{Ref, N,
//! {done, Result}}`, N the number of requests before it. `Call` is a
//! resource holding where the answers go: `job_tx_close(Call)`, or the
//! caller dropping it (dying), fails every read still waiting (and every
//! later one), and the call ends.
//!
//! Requests: `{get, Key, Snapshot}`, `{get_range, Begin, End, Limit,
//! Reverse, Snapshot}`, `get_read_version`, `{set, K, V}`, `{clear, K}`,
//! `{clear_range, B, E}`, `{add, K, Param}`, `{byte_max, K, V}`,
//! `{set_versionstamped_key, K, V}`, `{set_versionstamped_value, K, V}`,
//! `{add_read_conflict_key, K}`, `{add_read_conflict_range, B, E}`. Answers: `{value, Bin | not_found}`,
//! `{range, [{K, V}]}`, `{version, V}`, `{error, FdbCode}`.
//!
//! An answer is copied into the core on the calling scheduler only up to
//! [`NORMAL_MAX_ROWS`] rows and [`NORMAL_MAX_BYTES`] bytes; past that
//! `job_tx_answer/3` answers `dirty` having done nothing, and
//! `job_tx_answer_dirty/3` copies it on a dirty CPU scheduler (a range
//! answer can hold megabytes).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use couch_workers_core::caller_tx::{
    fdb_code_error, Answer as TxAnswer, Answers as TxAnswers, Request as TxRequest, Sent as TxSent, Session, TxJobs,
};
use futures::FutureExt;
use rustler::env::SavedTerm;
use rustler::{Encoder, Env, LocalPid, NifResult, OwnedEnv, Resource, ResourceArc, Term};
use tokio::sync::mpsc::UnboundedReceiver;

use super::args::{finish_args, handle_args, info_opts_args, job_args, json_arg, vs_arg};
use super::terms::{core_error, handle_answer, ok_answer};
use super::types::job_with_history_answer;
use crate::atoms;
use crate::json::{budgeted_nif, Sched};
use crate::reply::{self, Answer};
use crate::term::{atom, binary, bytes_arg, error_tuple};

/// Most rows of an answer copied on a normal scheduler (each row is two
/// allocations and two copies: well under 1 ms for these).
pub const NORMAL_MAX_ROWS: usize = 1_000;
/// Most bytes of an answer copied on a normal scheduler.
pub const NORMAL_MAX_BYTES: usize = 1 << 20;

/// Where the answers of one call's reads go.
pub struct CallResource {
    answers: TxAnswers,
}

#[rustler::resource_impl(register = false)]
impl Resource for CallResource {}

/// The session of one attempt of a caller's transaction (`store::overlay`
/// in the core): what its calls wrote with versionstamps.
pub struct SessionResource {
    session: Arc<Session>,
}

#[rustler::resource_impl(register = false)]
impl Resource for SessionResource {}

/// A session for the attempt of a caller's transaction that reads at
/// `read_version`; every call made in that attempt takes it.
#[rustler::nif]
fn job_tx_session(read_version: u64) -> ResourceArc<SessionResource> {
    ResourceArc::new(SessionResource { session: Session::new(read_version) })
}

budgeted_nif!(job_tx_add, job_tx_add_dirty, add(reference, session, job_type, id, info, opts));

// The NIF's arguments, the environment and the scheduler: the shape every
// `budgeted_nif!` body has.
#[allow(clippy::too_many_arguments)]
fn add<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    session: Term<'a>,
    job_type: Term<'a>,
    id: Term<'a>,
    info: Term<'a>,
    opts: Term<'a>,
    sched: Sched,
) -> NifResult<Term<'a>> {
    let (job_type, id) = job_args(reference, job_type, id)?;
    let (info, opts) = try_json!(info_opts_args(env, info, opts, sched));
    start(env, reference, session, move |jobs| async move {
        match jobs.add(&job_type, &id, &info, &opts).await {
            Ok(()) => ok_answer(()),
            Err(e) => core_error(&e),
        }
    })
}

#[rustler::nif]
fn job_tx_get<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    session: Term<'a>,
    job_type: Term<'a>,
    id: Term<'a>,
) -> NifResult<Term<'a>> {
    let (job_type, id) = job_args(reference, job_type, id)?;
    start(env, reference, session, move |jobs| async move {
        match jobs.get(&job_type, &id).await {
            Ok(found) => job_with_history_answer(found),
            Err(e) => core_error(&e),
        }
    })
}

budgeted_nif!(job_tx_update, job_tx_update_dirty, update(reference, session, handle, info));

fn update<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    session: Term<'a>,
    handle: Term<'a>,
    info: Term<'a>,
    sched: Sched,
) -> NifResult<Term<'a>> {
    let fence = handle_args(reference, handle)?;
    let info = match json_arg(env, info, sched, atoms::invalid_info()) {
        Ok(bytes) => bytes,
        Err(answer) => return answer,
    };
    start(env, reference, session, move |jobs| async move {
        match jobs.update(&fence, &info).await {
            Ok(handle) => handle_answer(handle),
            Err(e) => core_error(&e),
        }
    })
}

budgeted_nif!(job_tx_finish, job_tx_finish_dirty, finish(reference, session, handle, result));

fn finish<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    session: Term<'a>,
    handle: Term<'a>,
    result: Term<'a>,
    sched: Sched,
) -> NifResult<Term<'a>> {
    let (fence, result) = match finish_args(env, reference, handle, result, sched) {
        Ok(args) => args,
        Err(answer) => return answer,
    };
    start(env, reference, session, move |jobs| async move { done(jobs.finish(&fence, &result).await) })
}

budgeted_nif!(job_tx_resubmit, job_tx_resubmit_dirty, resubmit(reference, session, job_type, id, info, opts, if_vs));

// The NIF's seven arguments, the environment and the scheduler: the shape
// every `budgeted_nif!` body has.
#[allow(clippy::too_many_arguments)]
fn resubmit<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    session: Term<'a>,
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
    start(env, reference, session, move |jobs| async move {
        done(jobs.resubmit(&job_type, &id, &info, &opts, if_vs.as_ref()).await)
    })
}

#[rustler::nif]
fn job_tx_remove<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    session: Term<'a>,
    job_type: Term<'a>,
    id: Term<'a>,
    vs: Term<'a>,
) -> NifResult<Term<'a>> {
    let (job_type, id) = job_args(reference, job_type, id)?;
    let vs = vs_arg(vs)?;
    start(env, reference, session, move |jobs| async move { done(jobs.remove(&job_type, &id, vs.as_ref()).await) })
}

#[rustler::nif]
fn job_tx_cancel<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    session: Term<'a>,
    job_type: Term<'a>,
    id: Term<'a>,
) -> NifResult<Term<'a>> {
    let (job_type, id) = job_args(reference, job_type, id)?;
    start(env, reference, session, move |jobs| async move { done(jobs.cancel(&job_type, &id).await) })
}

fn done(result: Result<(), couch_workers_core::Error>) -> Answer {
    match result {
        Ok(()) => ok_answer(()),
        Err(e) => core_error(&e),
    }
}

budgeted_nif!(job_tx_answer, job_tx_answer_dirty, give_answer(call, seq, answer));

/// Gives read `seq` of `call` its answer: `true`, or `false` if no such
/// read waits (the call ended); `dirty` past the normal scheduler's budget.
fn give_answer<'a>(env: Env<'a>, call: Term<'a>, seq: Term<'a>, answer: Term<'a>, sched: Sched) -> NifResult<Term<'a>> {
    let call: ResourceArc<CallResource> = call.decode()?;
    let seq: u64 = seq.decode()?;
    if sched == Sched::Normal && !within_budget(answer)? {
        return Ok(atoms::dirty().encode(env));
    }
    let answer = answer_arg(answer)?;
    Ok(call.answers.answer(seq, answer).encode(env))
}

/// Ends the call: every read still waiting, and every later one, fails
/// (the call answers `{error, closed}` unless it has ended). `ok`.
#[rustler::nif]
fn job_tx_close(call: ResourceArc<CallResource>) -> rustler::Atom {
    call.answers.close();
    atoms::ok()
}

/// A call whose owner has closed it, for the scheduler test to time
/// `job_tx_answer/3` on any store (it answers `false`).
#[rustler::nif]
fn test_tx_call<'a>(env: Env<'a>) -> Term<'a> {
    let (_, _, answers) = couch_workers_core::caller_tx::channel();
    answers.close();
    ResourceArc::new(CallResource { answers }).encode(env)
}

/// Whether a range answer's rows and bytes fit [`NORMAL_MAX_ROWS`] and
/// [`NORMAL_MAX_BYTES`] (shapes are checked by `answer_arg`; a shape this
/// does not know counts as within, and is refused there).
fn within_budget(term: Term) -> NifResult<bool> {
    let Ok((_, value)) = term.decode::<(rustler::Atom, Term)>() else { return Ok(true) };
    if value.is_binary() {
        return Ok(bytes_arg(value)?.len() <= NORMAL_MAX_BYTES);
    }
    if !value.is_list() {
        return Ok(true);
    }
    let (mut rows, mut bytes) = (0usize, 0usize);
    for row in value.into_list_iterator()? {
        rows += 1;
        if let Ok((k, v)) = row.decode::<(Term, Term)>() {
            bytes += bytes_arg(k).map_or(0, <[u8]>::len) + bytes_arg(v).map_or(0, <[u8]>::len);
        }
        if rows > NORMAL_MAX_ROWS || bytes > NORMAL_MAX_BYTES {
            return Ok(false);
        }
    }
    Ok(true)
}

fn answer_arg(term: Term) -> NifResult<TxAnswer> {
    let (tag, value): (rustler::Atom, Term) = term.decode()?;
    let name = tag.to_term(term.get_env()).atom_to_string()?;
    Ok(match name.as_str() {
        "value" if value.is_binary() => TxAnswer::Value(Some(bytes_arg(value)?.to_vec())),
        "value" => {
            if value.atom_to_string()? != "not_found" {
                return Err(rustler::Error::BadArg);
            }
            TxAnswer::Value(None)
        }
        "range" => {
            let mut rows = Vec::new();
            for row in value.into_list_iterator()? {
                let (k, v): (Term, Term) = row.decode()?;
                rows.push((bytes_arg(k)?.to_vec(), bytes_arg(v)?.to_vec()));
            }
            TxAnswer::Range(rows)
        }
        "version" => TxAnswer::Version(value.decode()?),
        "error" => TxAnswer::Failed(fdb_code_error(value.decode()?)),
        _ => return Err(rustler::Error::BadArg),
    })
}

/// Starts `call` on the runtime with a forwarding transaction of
/// `session` and the relay of its requests; answers `{ok, Call}` at once,
/// or `{error, Name}` (`fdb_only`, `not_started`) having started nothing.
/// A `session` that is not a session resource is `badarg`.
fn start<'a, F, Fut>(env: Env<'a>, reference: Term<'a>, session: Term<'a>, call: F) -> NifResult<Term<'a>>
where
    F: FnOnce(TxJobs) -> Fut,
    Fut: std::future::Future<Output = Answer> + Send + 'static,
{
    let session: ResourceArc<SessionResource> = session.decode()?;
    let (jobs, rt) = match super::service(env) {
        Ok(s) => s,
        Err(answer) => return Ok(answer),
    };
    let (tx_jobs, requests, answers) = match jobs.in_caller_tx(session.session.clone()) {
        Ok(parts) => parts,
        Err(e) => return Ok(error_tuple(env, e.name())),
    };
    let relay = Relay::new(env, reference);
    let work = call(tx_jobs);
    rt.spawn(relay.run(work, requests));
    Ok((atoms::ok(), ResourceArc::new(CallResource { answers })).encode(env))
}

/// The calling process and its reference, for the call's messages. The
/// reference lives in an environment of its own, never cleared; each
/// message is built (with a copy of it) in a fresh one, as
/// `send_and_clear` clears the environment it sends from.
struct Relay {
    reference_env: OwnedEnv,
    reference: SavedTerm,
    pid: LocalPid,
}

impl Relay {
    fn new(env: Env, reference: Term) -> Relay {
        let reference_env = OwnedEnv::new();
        let reference = reference_env.save(reference);
        Relay { reference_env, reference, pid: env.pid() }
    }

    /// Relays every request until the call ends, then its result; a panic
    /// in the call ends it with `{error, {panic, Msg}}`.
    async fn run(mut self, work: impl std::future::Future<Output = Answer>, mut requests: UnboundedReceiver<TxSent>) {
        let work = AssertUnwindSafe(work).catch_unwind();
        tokio::pin!(work);
        let mut next = 0u64;
        let result = loop {
            tokio::select! {
                biased;
                Some(sent) = requests.recv() => {
                    next = sent.id + 1;
                    self.send(sent.id, move |env| request_term(env, &sent.request));
                }
                result = &mut work => break result,
            }
        };
        // The call dropped its transaction: what it sent last is queued.
        while let Ok(sent) = requests.try_recv() {
            next = sent.id + 1;
            self.send(sent.id, move |env| request_term(env, &sent.request));
        }
        let answer = result.unwrap_or_else(|payload| reply::panicked(reply::panic_message(payload.as_ref())));
        self.send(next, move |env| (atom(env, "done"), answer(env)).encode(env));
    }

    fn send(&mut self, seq: u64, msg: impl for<'b> FnOnce(Env<'b>) -> Term<'b>) {
        let pid = self.pid;
        let saved = &self.reference;
        self.reference_env.run(|ref_env| {
            let reference = saved.load(ref_env);
            // A dead caller: its resource goes with it, and the reads fail.
            let _ = OwnedEnv::new().send_and_clear(&pid, |env| (reference.in_env(env), seq, msg(env)).encode(env));
        });
    }
}

fn request_term<'a>(env: Env<'a>, request: &TxRequest) -> Term<'a> {
    let b = |bytes: &[u8]| binary(env, bytes);
    let tag = |name: &str| atom(env, name);
    match request {
        TxRequest::Get { key, snapshot } => (tag("get"), b(key), *snapshot).encode(env),
        TxRequest::GetRange(r) => {
            (tag("get_range"), b(&r.begin), b(&r.end), r.limit as u64, r.reverse, r.snapshot).encode(env)
        }
        TxRequest::ReadVersion => tag("get_read_version"),
        TxRequest::Set { key, value } => (tag("set"), b(key), b(value)).encode(env),
        TxRequest::Clear { key } => (tag("clear"), b(key)).encode(env),
        TxRequest::ClearRange { begin, end } => (tag("clear_range"), b(begin), b(end)).encode(env),
        TxRequest::AtomicAdd { key, param } => (tag("add"), b(key), b(param)).encode(env),
        TxRequest::AtomicByteMax { key, value } => (tag("byte_max"), b(key), b(value)).encode(env),
        TxRequest::SetVersionstampedKey { key, value } => (tag("set_versionstamped_key"), b(key), b(value)).encode(env),
        TxRequest::SetVersionstampedValue { key, value } => {
            (tag("set_versionstamped_value"), b(key), b(value)).encode(env)
        }
        TxRequest::AddReadConflictKey { key } => (tag("add_read_conflict_key"), b(key)).encode(env),
        TxRequest::AddReadConflictRange { begin, end } => {
            (tag("add_read_conflict_range"), b(begin), b(end)).encode(env)
        }
    }
}
