//! `job_accept/4`, `job_finish_accept/4` and `job_accept_abandon/1`.
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
//!
//! `job_finish_accept/4` (a finish and the next accept in one transaction)
//! answers through the same waiter: a job it took for a caller that gave
//! up goes back to pending the same way.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use couch_workers_core::Error as CoreError;
use couch_workers_core::Incarnation;
use couch_workers_core::{AcceptReply, GoneSignal, JobHandle, NextFor};
use rustler::{Encoder, Env, Error, NifResult, Resource, ResourceArc, Term};

use futures::FutureExt;

use super::args::{check_ref, finish_args};
use super::terms::{core_error, handle_answer};
use crate::atoms;
use crate::json::{budgeted_nif, Sched};
use crate::reply::{self, Answer, Replier};
use crate::runtime;
use crate::stats::{self, LiveResource};
use crate::term::bytes_arg;
use crate::workers::registration_arg;

const WAITING: u8 = 0;
const DELIVERED: u8 = 1;
const ABANDONED: u8 = 2;

/// The state a waiter and its replier share: `waiting → delivered |
/// abandoned`, and the dispatcher's signal, rung when it turns `abandoned`
/// (so that the dispatcher drops the waiter at once, without polling).
#[derive(Default)]
struct Shared {
    state: AtomicU8,
    gone: Mutex<Option<GoneSignal>>,
}

impl Shared {
    /// `waiting → abandoned`; rings the dispatcher if it moved. Returns
    /// the state before (`Ok`: it was waiting).
    fn abandon(&self) -> Result<u8, u8> {
        let moved = self.state.compare_exchange(WAITING, ABANDONED, Ordering::SeqCst, Ordering::SeqCst);
        if moved.is_ok() {
            // A notify: no blocking, fine on a scheduler thread.
            if let Some(signal) = &*self.gone.lock().unwrap_or_else(|p| p.into_inner()) {
                signal.ring();
            }
        }
        moved
    }
}

/// What the caller of `job_accept/4` holds while it waits.
pub struct WaiterResource {
    state: Arc<Shared>,
    _live: LiveResource,
}

#[rustler::resource_impl(register = false)]
impl Resource for WaiterResource {}

impl Drop for WaiterResource {
    fn drop(&mut self) {
        // The caller let go of it: it returned (the state is `delivered`
        // already, nothing changes) or died (nobody waits any more).
        let _ = self.state.abandon();
    }
}

// ---- accept -----------------------------------------------------------------

/// The core's reply object for one `job_accept/4`.
struct AcceptReplier {
    state: Arc<Shared>,
    replier: Option<Replier>,
}

impl AcceptReply for AcceptReplier {
    fn is_waiting(&self) -> bool {
        self.state.state.load(Ordering::SeqCst) == WAITING
    }

    fn signal_gone(&mut self, gone: GoneSignal) -> bool {
        let mut slot = self.state.gone.lock().unwrap_or_else(|p| p.into_inner());
        // Abandoned before the signal was set: `abandon` rang nothing.
        if !self.is_waiting() {
            gone.ring();
        }
        *slot = Some(gone);
        true
    }

    fn deliver(mut self: Box<Self>, outcome: Result<JobHandle, CoreError>) -> bool {
        let answer = match outcome {
            Ok(handle) => handle_answer(handle),
            Err(e) => core_error(&e),
        };
        self.answer(answer)
    }
}

impl AcceptReplier {
    /// Sends `answer` unless the waiter was abandoned; whether it reached
    /// a live caller (if not, a job in it must go back).
    fn answer(&mut self, answer: Answer) -> bool {
        let Some(replier) = self.replier.take() else { return false };
        if self.state.state.compare_exchange(WAITING, DELIVERED, Ordering::SeqCst, Ordering::SeqCst).is_err() {
            // Abandoned: nobody waits for this answer.
            replier.discard();
            return false;
        }
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
            if self.state.state.load(Ordering::SeqCst) == ABANDONED {
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
    let reg = registration_arg(worker)?;
    if reg.worker_type != worker_type {
        return Err(Error::BadArg);
    }
    Ok((reg.id, Some(reg.incarnation)))
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
    let (waiter, replier) = waiter(env, reference);
    // On the runtime, so that every delivery (also an immediate error)
    // happens off the schedulers.
    rt.spawn(async move {
        jobs.accept_registered_with(
            worker_type,
            worker,
            incarnation,
            Duration::from_millis(timeout_ms),
            Box::new(replier),
        );
    });
    Ok((atoms::ok(), waiter).encode(env))
}

/// A new waiter and the replier that answers it.
fn waiter(env: Env<'_>, reference: Term<'_>) -> (ResourceArc<WaiterResource>, AcceptReplier) {
    let state = Arc::new(Shared { state: AtomicU8::new(WAITING), gone: Mutex::new(None) });
    let waiter =
        ResourceArc::new(WaiterResource { state: state.clone(), _live: LiveResource::new(&stats::ACCEPT_WAITERS) });
    (waiter, AcceptReplier { state, replier: Some(Replier::new(env, reference)) })
}

// ---- finish and accept the next -------------------------------------------

budgeted_nif!(job_finish_accept, job_finish_accept_dirty, finish_accept(reference, handle, result, worker));

/// Finishes `handle`'s job and takes the next one for the registration
/// `worker` in one transaction; answers `{Ref, {ok, Handle}}`, `{Ref, {ok,
/// none}}` (finished, nothing taken) or `{Ref, {error, Reason}}`.
fn finish_accept<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    handle: Term<'a>,
    result: Term<'a>,
    worker: Term<'a>,
    sched: Sched,
) -> NifResult<Term<'a>> {
    let reg = registration_arg(worker)?;
    let (fence, result) = try_json!(finish_args(env, reference, handle, result, sched));
    let (jobs, rt) = try_service!(env);
    let (waiter, mut replier) = waiter(env, reference);
    rt.spawn(async move {
        let next = NextFor { worker_type: &reg.worker_type, worker: &reg.id, incarnation: Some(reg.incarnation) };
        let work = jobs.finish_accept(&fence, &result, next);
        let (answer, taken) = match AssertUnwindSafe(work).catch_unwind().await {
            Ok(Ok(Some(handle))) => (handle_answer(handle.clone()), Some(handle)),
            Ok(Ok(None)) => (reply::ok_with(atoms::none()), None),
            Ok(Err(e)) => (core_error(&e), None),
            Err(payload) => (reply::panicked(reply::panic_message(payload.as_ref())), None),
        };
        if !replier.answer(answer) {
            if let Some(handle) = taken {
                jobs.give_back(handle).await;
            }
        }
    });
    Ok((atoms::ok(), waiter).encode(env))
}

#[rustler::nif]
fn job_accept_abandon<'a>(env: Env<'a>, waiter: Term<'a>) -> NifResult<Term<'a>> {
    let waiter: ResourceArc<WaiterResource> = waiter.decode().map_err(|_| Error::BadArg)?;
    match waiter.state.abandon() {
        Ok(_) => Ok(atoms::abandoned().encode(env)),
        Err(ABANDONED) => Ok(atoms::abandoned().encode(env)),
        Err(_) => Ok(atoms::delivered().encode(env)),
    }
}
