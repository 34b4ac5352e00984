//! Leadership NIFs: `leader/2` reads a worker type's leader, and the
//! leadership events of a registration (set up by `worker_notify/3`,
//! `workers.rs`) become `{couch_workers_leader, Tag, Epoch}` and
//! `{couch_workers_leader_lost, Tag, Epoch}` to its owner.

use couch_workers_core::leaders::{LeaderEvent, Leadership};
use rustler::{Encoder, Env, Error, NifResult, Term};

use crate::atoms;
use crate::reply::{self, Replier};
use crate::runtime;
use crate::term::{binary, bytes_arg, error_tuple};

/// `leader(Ref, WorkerType)`: replies `{ok, Id, Epoch}` (the type's
/// oldest current registration, read at one version) or `{error,
/// not_found}`.
#[rustler::nif]
fn leader<'a>(env: Env<'a>, reference: Term<'a>, worker_type: Term<'a>) -> NifResult<Term<'a>> {
    if !reference.is_ref() {
        return Err(Error::BadArg);
    }
    let worker_type = bytes_arg(worker_type)?.to_vec();
    let node = match runtime::running() {
        Ok(node) => node,
        Err(e) => return Ok(error_tuple(env, e.name())),
    };
    let leadership = Leadership::new(node.context().clone());
    reply::spawn(node.runtime(), Replier::new(env, reference), async move {
        match leadership.leader(&worker_type).await {
            Ok(Some((id, epoch))) => leader_answer(id, epoch),
            Ok(None) => reply::error("not_found"),
            Err(e) => reply::error(e.name()),
        }
    });
    Ok(atoms::ok().encode(env))
}

/// `{ok, Id, Epoch}`.
fn leader_answer(id: Vec<u8>, epoch: Vec<u8>) -> reply::Answer {
    Box::new(move |env: Env<'_>| (atoms::ok(), binary(env, &id), binary(env, &epoch)).encode(env))
}

/// A leadership event as the owner's message, with the registration's
/// tag.
pub fn event_message<'a>(env: Env<'a>, tag: Term<'a>, event: &LeaderEvent) -> Term<'a> {
    match event {
        LeaderEvent::Leader(epoch) => (atoms::couch_workers_leader(), tag, binary(env, epoch)).encode(env),
        LeaderEvent::LeaderLost(epoch) => (atoms::couch_workers_leader_lost(), tag, binary(env, epoch)).encode(env),
    }
}
