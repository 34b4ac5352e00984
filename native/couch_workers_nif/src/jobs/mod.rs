//! Job queue NIFs (the core's `JobService`, `node.jobs()`).
//!
//! Signatures, immediate answers and the `{Ref, Result}` replies of these
//! NIFs are listed once, in the `@doc` of `src/couch_workers_nif.erl` (the
//! stubs Erlang calls); this module documents what that list does not:
//! argument shapes, the immediate errors, and how accepts and
//! subscriptions keep "exactly one answer".
//!
//! Shapes (else `badarg`): `Type`, `Id` binaries; `Worker` a binary, or
//! (`job_accept/4`) a registration of `Type` (see `accept_worker`);
//! `Registration` (`job_finish_accept/4`) a registration of any type; `Info` and
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
//! How an accept keeps "exactly one answer": `accept.rs`.
//!
//! | module | what |
//! | --- | --- |
//! | `args.rs` | argument shapes and values answered at once |
//! | `terms.rs` | a job as a map; the answers the NIFs reply with |
//! | `calls.rs` | the NIFs that are one service call and one reply (add, update, finish, fail, release, resubmit, cancel, remove, get, counts, list, pause) |
//! | `accept.rs` | `job_accept/4`, `job_finish_accept/4`, `job_accept_abandon/1`: the waiter resource and its one answer |
//! | `in_tx.rs` | `job_tx_session/1`, `job_tx_add/6`, `job_tx_update/4`, `job_tx_finish/4`, `job_tx_resubmit/7`, `job_tx_get/4`, `job_tx_remove/5`, `job_tx_cancel/4`, `job_tx_answer/3`, `job_tx_close/1`: calls inside the caller's erlfdb transaction, their requests relayed to it |
//! | `fenced.rs` | `job_add_if_leader/6`, `job_resubmit_if_leader/7`: add and resubmit fenced by a leadership (`if_leader`) |
//! | `schedules.rs` | `schedule_set/7`, `schedule_remove/3`, `schedules/2`, `schedule_types/1`: recurring jobs |
//! | `subscribe.rs` | `job_subscribe/5`, `job_unsubscribe/1`: the subscription resource and its notifier |
//! | `types.rs` | `job_type_get/2`, `job_type_set/3`: a job type's settings |

use std::future::Future;

use couch_workers_core::Error as CoreError;
use couch_workers_core::{AddManyError, JobService};
use rustler::{Encoder, Env, NifResult, Term};

use crate::atoms;
use crate::reply::{self, Answer, Replier};
use crate::runtime;
use crate::term::error_tuple;

/// The running node's job service and runtime, or the `{error, Name}` to
/// answer.
fn service<'a>(env: Env<'a>) -> Result<(JobService, tokio::runtime::Handle), Term<'a>> {
    match runtime::running() {
        Ok(node) => Ok((node.jobs().clone(), node.runtime().clone())),
        Err(e) => Err(error_tuple(env, e.name())),
    }
}

/// An error a job-service call can end with, as the `{error, ...}` of its
/// reply.
trait ErrorAnswer {
    fn into_answer(self) -> Answer;
}

impl ErrorAnswer for CoreError {
    fn into_answer(self) -> Answer {
        terms::core_error(&self)
    }
}

impl ErrorAnswer for AddManyError {
    fn into_answer(self) -> Answer {
        match self {
            AddManyError::AlreadyExists(ids) => terms::already_exists_answer(ids),
            AddManyError::Error(e) => terms::core_error(&e),
        }
    }
}

/// The shape of every job NIF that is one call into the job service:
/// `call` runs on the runtime, and its result becomes the one `{Ref,
/// Result}` reply (`answer` of its value, or its error); the NIF itself
/// answers `ok` at once, or `{error, not_started}` when no node runs. The
/// NIF checks its arguments first, so a refused call starts nothing.
fn spawn_call<'a, T, E, Fut>(
    env: Env<'a>,
    reference: Term<'a>,
    call: impl FnOnce(JobService) -> Fut,
    answer: impl FnOnce(T) -> Answer + Send + 'static,
) -> NifResult<Term<'a>>
where
    Fut: Future<Output = Result<T, E>> + Send + 'static,
    E: ErrorAnswer,
{
    let (jobs, rt) = match service(env) {
        Ok(s) => s,
        Err(answer) => return Ok(answer),
    };
    let work = call(jobs);
    reply::spawn(&rt, Replier::new(env, reference), async move {
        match work.await {
            Ok(value) => answer(value),
            Err(e) => e.into_answer(),
        }
    });
    Ok(atoms::ok().encode(env))
}

macro_rules! try_service {
    ($env:expr) => {
        match $crate::jobs::service($env) {
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

mod accept;
mod args;
mod calls;
mod fenced;
mod in_tx;
mod schedules;
mod subscribe;
mod terms;
mod types;

pub fn load(env: Env) -> bool {
    env.register::<accept::WaiterResource>().is_ok()
        && env.register::<subscribe::SubscriptionResource>().is_ok()
        && env.register::<in_tx::CallResource>().is_ok()
        && env.register::<in_tx::SessionResource>().is_ok()
}
