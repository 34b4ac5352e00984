//! Worker NIFs.
//!
//! Their signatures, immediate answers and messages are listed once, in
//! the `@doc` of `src/couch_workers_nif.erl`; this module documents what
//! that list does not.
//!
//! `Type` and `Id` must be binaries and `Opts` a map (else `badarg`).
//! Answered at once, nothing written: `{error, invalid_options}` (a term
//! JSON cannot hold), `{error, value_too_large}` (options over the value
//! limit), `{error, invalid_timeout}` (`timeout`, under an atom or a binary
//! key, is not a positive integer), `{error, not_started}`. The store's
//! answers (`key_too_large`, `invalid_timeout` over a week, store errors)
//! come in the reply. `dirty`: `Opts` has more terms than a normal
//! scheduler may convert (see `json.rs`); nothing was done, call
//! `worker_register_dirty/4` (DirtyCpu) with the same arguments, as
//! `couch_workers_nif:budgeted/2` does.
//!
//! `Registration` is a resource holding the core's `Registration`: the
//! worker stays registered (and heartbeats) while it lives, and when it is
//! garbage collected the worker is removed (the core's `Drop`).
//!
//! `worker_notify/3` says where the registration's owner events go
//! (`Owner`: a local pid; `Tag`: a reference, copied into each message);
//! called again (by a restarted server) it replaces the caller and owner.
//! Events that happened before the first call are sent then; each event is
//! sent once, to the pids set at its time. When the registration was
//! superseded before the call, the caller gets
//! `{couch_workers_worker_superseded, Tag}` again (the owner is not told
//! twice), so a restarted server learns it too. The listener is set on the
//! runtime, so the call returns at once. The same call sends the
//! registration's leadership events to `Owner` (`leader.rs`): a
//! leadership that began before it is told then.

use std::sync::{Arc, Weak};

use couch_workers_core::leaders::LeaderEvent;
use couch_workers_core::log_event;
use couch_workers_core::Incarnation;
use couch_workers_core::Logger;
use couch_workers_core::WorkerSpec;
use couch_workers_core::{Node, Registration};
use couch_workers_core::{OnOwnerEvent, OwnerEvent};
use rustler::{Encoder, Env, Error, LocalPid, NifResult, OwnedEnv, Resource, ResourceArc, Term};
use serde_json::Value;

use crate::atoms;
use crate::json::{self, budgeted_nif, Sched};
use crate::reply::{self, Replier};
use crate::runtime;
use crate::stats::{self, LiveResource};
use crate::term::{binary, bytes_arg, error_tuple};

/// Health timeout when the options name none, seconds.
pub const DEFAULT_TIMEOUT_S: u64 = 15;

pub struct RegistrationResource {
    /// The node that registered it: after a restart of the application a
    /// leftover handle must not touch the new node.
    node: Weak<Node>,
    reg: Registration,
    _live: LiveResource,
}

#[rustler::resource_impl(register = false)]
impl Resource for RegistrationResource {}

/// The worker a registration argument names: its type, its id, and the
/// incarnation of that registration (an accept for it takes nothing once
/// a later registration holds the id, see `jobs/accept.rs`).
pub struct RegisteredWorker {
    pub worker_type: Vec<u8>,
    pub id: Vec<u8>,
    pub incarnation: Incarnation,
}

/// A registration argument (what `worker_register` answered); `badarg`
/// for any other term.
pub fn registration_arg(term: Term<'_>) -> NifResult<RegisteredWorker> {
    let resource: ResourceArc<RegistrationResource> = term.decode().map_err(|_| Error::BadArg)?;
    let spec = resource.reg.spec();
    Ok(RegisteredWorker {
        worker_type: spec.worker_type.clone(),
        id: spec.id.clone(),
        incarnation: *resource.reg.incarnation(),
    })
}

pub fn load(env: Env) -> bool {
    env.register::<RegistrationResource>().is_ok()
}

/// At most the first 64 bytes of a type or id, for log events (keys may
/// be 10,000 bytes long).
fn short(bytes: &[u8]) -> &[u8] {
    &bytes[..bytes.len().min(64)]
}

/// The health timeout from the options object.
fn timeout_s(options: &serde_json::Map<String, Value>) -> Option<u64> {
    match options.get("timeout") {
        None => Some(DEFAULT_TIMEOUT_S),
        Some(Value::Number(n)) => n.as_u64().filter(|t| *t > 0),
        Some(_) => None,
    }
}

budgeted_nif!(worker_register, worker_register_dirty, register(reference, worker_type, id, opts));

fn register<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    worker_type: Term<'a>,
    id: Term<'a>,
    opts: Term<'a>,
    sched: Sched,
) -> NifResult<Term<'a>> {
    if !reference.is_ref() {
        return Err(Error::BadArg);
    }
    let worker_type = bytes_arg(worker_type)?.to_vec();
    let id = bytes_arg(id)?.to_vec();
    let options = match json::map_arg(env, opts, sched, atoms::invalid_options(), |e| {
        log_event!(Logger::PROCESS, Debug, "invalid_options", "type" = short(&worker_type), id = short(&id), reason = %e);
    }) {
        Ok(options) => options,
        Err(answer) => return answer,
    };
    let Some(timeout_s) = timeout_s(&options) else {
        return Ok((atoms::error(), atoms::invalid_timeout()).encode(env));
    };
    let options_json = match serde_json::to_vec(&Value::Object(options)) {
        Ok(bytes) => bytes,
        Err(_) => return Ok((atoms::error(), atoms::invalid_options()).encode(env)),
    };
    let node = match runtime::running() {
        Ok(node) => node,
        Err(e) => return Ok(error_tuple(env, e.name())),
    };
    let spec = WorkerSpec { worker_type, id, options_json, timeout_s };
    let replier = Replier::new(env, reference);
    let rt = node.runtime().clone();
    reply::spawn(&rt, replier, async move {
        match node.register_worker(spec).await {
            Ok(reg) => reply::ok_with(ResourceArc::new(RegistrationResource {
                node: Arc::downgrade(&node),
                reg,
                _live: LiveResource::new(&stats::REGISTRATIONS),
            })),
            Err(e) => reply::error(e.name()),
        }
    });
    Ok(atoms::ok().encode(env))
}

#[rustler::nif]
fn worker_unregister<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    registration: ResourceArc<RegistrationResource>,
) -> NifResult<Term<'a>> {
    end_registration(env, reference, registration, false)
}

/// `worker_unregister/2` for a registration whose owner died: its running
/// jobs fail with `worker_lost` (`Node::worker_died`) instead of being
/// released.
#[rustler::nif]
fn worker_remove_dead<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    registration: ResourceArc<RegistrationResource>,
) -> NifResult<Term<'a>> {
    end_registration(env, reference, registration, true)
}

fn end_registration<'a>(
    env: Env<'a>,
    reference: Term<'a>,
    registration: ResourceArc<RegistrationResource>,
    died: bool,
) -> NifResult<Term<'a>> {
    if !reference.is_ref() {
        return Err(Error::BadArg);
    }
    let node = match registration.node.upgrade() {
        Some(node) if !node.is_stopped() => node,
        // Its node stopped: nothing of it is left to remove.
        _ => return Ok(error_tuple(env, "not_started")),
    };
    let replier = Replier::new(env, reference);
    let rt = node.runtime().clone();
    reply::spawn(&rt, replier, async move {
        let removed = if died {
            node.worker_died(&registration.reg).await
        } else {
            node.unregister_worker(&registration.reg).await
        };
        match removed {
            Ok(()) => reply::ok(),
            Err(e) => reply::error(e.name()),
        }
    });
    Ok(atoms::ok().encode(env))
}

#[rustler::nif]
fn worker_notify<'a>(
    env: Env<'a>,
    registration: ResourceArc<RegistrationResource>,
    owner: LocalPid,
    tag: Term<'a>,
) -> NifResult<Term<'a>> {
    if !tag.is_ref() {
        return Err(Error::BadArg);
    }
    let node = match registration.node.upgrade() {
        Some(node) if !node.is_stopped() => node,
        // Its node stopped: no heartbeat will find anything.
        _ => return Ok(atoms::ok().encode(env)),
    };
    let target = Arc::new(OwnerTarget { owner, server: env.pid(), tag: tag.to_binary().as_slice().to_vec() });
    let listener_target = target.clone();
    let listener: OnOwnerEvent = Box::new(move |event| listener_target.send(event));
    let leader_target = target.clone();
    let on_leader: Box<dyn Fn(LeaderEvent) + Send + Sync> = Box::new(move |event| {
        leader_target.send_to(&leader_target.owner, |env, tag| crate::leader::event_message(env, tag, &event))
    });
    node.runtime().spawn(async move {
        if registration.reg.listen(listener) {
            target.send_server_superseded();
        }
        registration.reg.listen_leadership(on_leader);
    });
    Ok(atoms::ok().encode(env))
}

/// Where one registration's owner events go. Always sent from a runtime
/// thread (the heartbeat task, or the task that sets the listener).
struct OwnerTarget {
    owner: LocalPid,
    server: LocalPid,
    /// The tag in the external term format (terms cannot outlive their
    /// environment).
    tag: Vec<u8>,
}

impl OwnerTarget {
    fn send(&self, event: OwnerEvent) {
        match event {
            OwnerEvent::Reaped => {
                self.send_to(&self.owner, |env, tag| (atoms::couch_workers_worker_reaped(), tag).encode(env));
            }
            OwnerEvent::Superseded => {
                self.send_to(&self.owner, |env, tag| {
                    (atoms::couch_workers_worker_lost(), tag, atoms::superseded()).encode(env)
                });
                self.send_server_superseded();
            }
            OwnerEvent::HeartbeatFailing => {
                self.send_to(&self.owner, |env, tag| {
                    (atoms::couch_workers_worker_at_risk(), tag, atoms::heartbeat_failing()).encode(env)
                });
            }
            OwnerEvent::JobTimedOut { job_type, job_id } => {
                self.send_to(&self.owner, |env, tag| {
                    let (t, id) = (binary(env, &job_type), binary(env, &job_id));
                    (atoms::couch_workers_job_timeout(), tag, t, id).encode(env)
                });
            }
        }
    }

    fn send_server_superseded(&self) {
        self.send_to(&self.server, |env, tag| (atoms::couch_workers_worker_superseded(), tag).encode(env));
    }

    /// Sends one message; a dead recipient is no error (nobody to tell).
    fn send_to(&self, pid: &LocalPid, build: impl for<'b> FnOnce(Env<'b>, Term<'b>) -> Term<'b>) {
        let mut msg_env = OwnedEnv::new();
        let sent = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = msg_env.send_and_clear(pid, |env| {
                let tag =
                    env.binary_to_term(&self.tag).map(|(t, _)| t).unwrap_or_else(|| atoms::undefined().encode(env));
                build(env, tag)
            });
        }));
        if sent.is_err() {
            log_event!(Logger::PROCESS, Error, "owner_event_send_failed");
        }
    }
}
