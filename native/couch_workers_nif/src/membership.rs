//! Membership watch NIFs.
//!
//! ```text
//! membership_watch(Type, Tag) -> {ok, Watch} | {error, Name}
//!     then, to the caller, on the first read and on every change:
//!     {couch_workers_membership_changed, Tag, Type, VS, Workers}
//! membership_unwatch(Watch) -> ok
//! ```
//!
//! `Type` must be a binary and `Tag` an atom or a reference (else
//! `badarg`): the tag is copied into every message, and first (in the
//! external format) on the calling scheduler, so it must be small
//! (`couch_workers_global` uses a fresh reference per watcher, so that
//! messages of a stopped watcher are told apart). `VS` is
//! the 10-byte versionstamp of the type's last membership change (zeros
//! when it never changed); every message has a greater one than the one
//! before. `Workers` is `#{Id => Options}`, options decoded from JSON with
//! binary keys. The first message comes also when there are no workers.
//!
//! `Watch` is a resource: the watcher runs until `membership_unwatch/1` or
//! until the resource is garbage collected. A message already on its way
//! may still arrive after `membership_unwatch/1`.

use std::panic::AssertUnwindSafe;
use std::sync::Mutex;

use couch_workers_core::log::{Event, Level};
use couch_workers_core::services::membership::OnMembership;
use couch_workers_core::workers::Membership;
use couch_workers_core::MembershipWatch;
use rustler::{Encoder, Env, Error, LocalPid, NifResult, OwnedEnv, Resource, ResourceArc, Term};

use crate::atoms;
use crate::json::json_bytes_to_term;
use crate::runtime;
use crate::stats::{self, Live};
use crate::term::{binary, bytes_arg, error_tuple};

pub struct WatchResource {
    watch: MembershipWatch,
    _live: Live,
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
    env: Mutex<OwnedEnv>,
}

impl Notifier {
    fn send(&self, membership: &Membership) -> bool {
        let mut env = self.env.lock().unwrap_or_else(|p| p.into_inner());
        env.send_and_clear(&self.pid, |env| self.encode(env, membership)).is_ok()
    }

    fn encode<'a>(&self, env: Env<'a>, m: &Membership) -> Term<'a> {
        let tag = env.binary_to_term(&self.tag).map(|(t, _)| t).unwrap_or_else(|| atoms::undefined().encode(env));
        let ids: Vec<Term<'a>> = m.workers.iter().map(|(id, _)| binary(env, id)).collect();
        let options: Vec<Term<'a>> = m.workers.iter().map(|(_, json)| json_bytes_to_term(env, json)).collect();
        // More than 128 workers: see `json::make_map`.
        let workers = crate::json::make_map(env, &ids, &options);
        (atoms::couch_workers_membership_changed(), tag, binary(env, &m.worker_type), binary(env, &m.vs), workers)
            .encode(env)
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
    let notifier =
        Notifier { pid: env.pid(), tag: tag.to_binary().as_slice().to_vec(), env: Mutex::new(OwnedEnv::new()) };
    let on_update: OnMembership = Box::new(move |membership: Membership| {
        // Called on a runtime thread. A panic here must not end the
        // watcher silently: log it and carry on with the next change.
        let sent = std::panic::catch_unwind(AssertUnwindSafe(|| notifier.send(&membership)));
        if sent.is_err() {
            crate::log::emit(
                Event::new(Level::Error, "membership_notify_failed").with("type", &membership.worker_type),
            );
        }
    });
    match node.watch_membership(worker_type, on_update) {
        Ok(watch) => {
            let res = ResourceArc::new(WatchResource { watch, _live: Live::new(&stats::WATCHES) });
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
