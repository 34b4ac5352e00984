//! Membership watch NIFs.
//!
//! Their signatures, immediate answers and messages are listed once, in
//! the `@doc` of `src/couch_workers_nif.erl`; this module documents what
//! that list does not.
//!
//! `Type` must be a binary and `Tag` an atom or a reference (else
//! `badarg`): the tag is copied into every message, and first (in the
//! external format) on the calling scheduler, so it must be small
//! (`couch_workers_global` uses a fresh reference per watcher, so that
//! messages of a stopped watcher are told apart). `VS` is
//! the 10-byte versionstamp of the type's last membership change (zeros
//! when it never changed); every message has a greater one than the one
//! before. The first message comes also when there are no workers.
//!
//! `changed` carries the whole membership: `Workers` is `#{Id => Options}`,
//! options decoded from JSON with binary keys. The first message is always
//! one. `delta` carries only what changed since the message before: apply
//! it to that message's `Workers` (`Left`, `[Id]`, removed; `Joined`,
//! `[{Id, Options}]`, put: new members and members with new options; no id
//! in both). So a change costs the NIF in proportion to the change, not to
//! the membership. A whole map comes again whenever the core watcher read
//! the whole member range (its log no longer reached back), when the
//! change is not smaller than the membership, and after a message that
//! could not be sent.
//!
//! `Watch` is a resource: the watcher runs until `membership_unwatch/1` or
//! until the resource is garbage collected. A message already on its way
//! may still arrive after `membership_unwatch/1`.

use std::panic::AssertUnwindSafe;
use std::sync::Mutex;

use couch_workers_core::log_event;
use couch_workers_core::Logger;
use couch_workers_core::MembershipWatch;
use couch_workers_core::{MemberChange, MembershipUpdate, OnMembershipUpdate};
use rustler::{Encoder, Env, Error, LocalPid, NifResult, OwnedEnv, Resource, ResourceArc, Term};

use crate::atoms;
use crate::json::json_bytes_to_term;
use crate::runtime;
use crate::stats::{self, LiveResource};
use crate::term::{binary, bytes_arg, error_tuple};

pub struct WatchResource {
    watch: MembershipWatch,
    _live: LiveResource,
}

#[rustler::resource_impl(register = false)]
impl Resource for WatchResource {}

pub fn load(env: Env) -> bool {
    env.register::<WatchResource>().is_ok()
}

/// Builds and sends the membership messages of one watcher.
struct Notifier {
    pid: LocalPid,
    /// The tag in the external term format (a term cannot outlive its
    /// environment, and the message environment is cleared on every send).
    tag: Vec<u8>,
    sender: Mutex<Sender>,
}

struct Sender {
    env: OwnedEnv,
    /// Every message so far was sent: the receiver's map is the watcher's
    /// previous delivery, so a delta applies to it.
    in_step: bool,
}

impl Notifier {
    fn send(&self, update: &MembershipUpdate) {
        let mut sender = self.sender.lock().unwrap_or_else(|p| p.into_inner());
        let delta = update.changes.filter(|c| sender.in_step && c.len() < update.members.len());
        // Out of step until this send succeeds (also if encoding panics).
        sender.in_step = false;
        let sent = sender.env.send_and_clear(&self.pid, |env| match delta {
            Some(changes) => self.encode_delta(env, update, changes),
            None => self.encode_whole(env, update),
        });
        couch_workers_core::stage_mark("membership_sent");
        sender.in_step = sent.is_ok();
    }

    fn tag<'a>(&self, env: Env<'a>) -> Term<'a> {
        env.binary_to_term(&self.tag).map(|(t, _)| t).unwrap_or_else(|| atoms::undefined().encode(env))
    }

    fn encode_whole<'a>(&self, env: Env<'a>, u: &MembershipUpdate) -> Term<'a> {
        let ids: Vec<Term<'a>> = u.members.keys().map(|id| binary(env, id)).collect();
        let options: Vec<Term<'a>> = u.members.values().map(|json| json_bytes_to_term(env, json)).collect();
        // More than 128 workers: see `json::make_map`.
        let workers = crate::json::make_map(env, &ids, &options);
        let kind = atoms::couch_workers_membership_changed();
        (kind, self.tag(env), binary(env, u.worker_type), binary(env, &u.vs), workers).encode(env)
    }

    fn encode_delta<'a>(&self, env: Env<'a>, u: &MembershipUpdate, changes: &[MemberChange]) -> Term<'a> {
        let mut joined: Vec<Term<'a>> = Vec::new();
        let mut left: Vec<Term<'a>> = Vec::new();
        for (id, options) in changes {
            match options {
                Some(json) => joined.push((binary(env, id), json_bytes_to_term(env, json)).encode(env)),
                None => left.push(binary(env, id)),
            }
        }
        let kind = atoms::couch_workers_membership_delta();
        (kind, self.tag(env), binary(env, u.worker_type), binary(env, &u.vs), joined, left).encode(env)
    }
}

#[rustler::nif]
fn membership_watch<'a>(env: Env<'a>, worker_type: Term<'a>, tag: Term<'a>) -> NifResult<Term<'a>> {
    let worker_type = bytes_arg(worker_type)?.to_vec();
    if !(tag.is_ref() || tag.is_atom()) {
        return Err(Error::BadArg);
    }
    let node = match runtime::running() {
        Ok(node) => node,
        Err(e) => return Ok(error_tuple(env, e.name())),
    };
    let notifier = Notifier {
        pid: env.pid(),
        tag: tag.to_binary().as_slice().to_vec(),
        sender: Mutex::new(Sender { env: OwnedEnv::new(), in_step: false }),
    };
    let on_update: OnMembershipUpdate = Box::new(move |update: MembershipUpdate| {
        // Called on a runtime thread. A panic here must not end the
        // watcher silently: log it and carry on with the next change
        // (which goes whole: the receiver missed this one).
        let sent = std::panic::catch_unwind(AssertUnwindSafe(|| notifier.send(&update)));
        if sent.is_err() {
            log_event!(Logger::PROCESS, Error, "membership_notify_failed", "type" = update.worker_type);
        }
    });
    match node.watch_membership_updates(worker_type, on_update) {
        Ok(watch) => {
            let res = ResourceArc::new(WatchResource { watch, _live: LiveResource::new(&stats::WATCHES) });
            Ok((atoms::ok(), res).encode(env))
        }
        Err(e) => Ok(error_tuple(env, e.name())),
    }
}

#[rustler::nif]
fn membership_unwatch<'a>(env: Env<'a>, watch: Term<'a>) -> NifResult<Term<'a>> {
    let watch: ResourceArc<WatchResource> = watch.decode().map_err(|_| Error::BadArg)?;
    watch.watch.stop();
    Ok(atoms::ok().encode(env))
}
