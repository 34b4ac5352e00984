//! Job subscriptions: the resource a subscriber holds, and the notifier
//! that sends it `{couch_workers_job, Ref, Job | removed}`.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use couch_workers_core::log_event;
use couch_workers_core::Logger;
use couch_workers_core::{Job, JobEvent, JobSubscription};
use rustler::{Encoder, Env, Error, LocalPid, NifResult, OwnedEnv, Resource, ResourceArc, Term};

use super::args::{check_ref, job_args};
use super::spawn_call;
use super::terms::job_to_term;
use crate::atoms;
use crate::reply::Answer;
use crate::runtime;
use crate::stats::{self, LiveResource};

/// A live job subscription; dropping it ends the subscription.
pub struct SubscriptionResource {
    sub: JobSubscription,
    _live: LiveResource,
}

#[rustler::resource_impl(register = false)]
impl Resource for SubscriptionResource {}

/// `{ok, Subscription, Job}`.
fn subscribed_answer(res: ResourceArc<SubscriptionResource>, job: Job) -> Answer {
    Box::new(move |env| (atoms::ok(), res, job_to_term(env, &job, None)).encode(env))
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
                let _ = env.send_and_clear(&self.pid, |env| {
                    (atoms::couch_workers_job(), self.tag(env), atoms::removed()).encode(env)
                });
                // To the server registered now, not the one that
                // subscribed: it may have crashed and been restarted
                // since, taking this subscription over.
                if let Some(server) = env.run(|env| env.whereis_pid(atoms::couch_workers_jobs_subs())) {
                    let _ = env
                        .send_and_clear(&server, |env| (atoms::couch_workers_job_ended(), self.tag(env)).encode(env));
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
    check_ref(sub_ref)?;
    let (job_type, id) = job_args(reference, job_type, id)?;
    let pid: LocalPid = pid.decode().map_err(|_| Error::BadArg)?;
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
            log_event!(Logger::PROCESS, Error, "job_notify_failed");
        }
    });
    spawn_call(
        env,
        reference,
        move |jobs| async move { jobs.subscribe(&job_type, &id, on_event).await },
        |(job, sub)| {
            let res =
                ResourceArc::new(SubscriptionResource { sub, _live: LiveResource::new(&stats::JOB_SUBSCRIPTIONS) });
            subscribed_answer(res, job)
        },
    )
}

#[rustler::nif]
fn job_unsubscribe<'a>(env: Env<'a>, sub: Term<'a>) -> NifResult<Term<'a>> {
    let sub: ResourceArc<SubscriptionResource> = sub.decode().map_err(|_| Error::BadArg)?;
    sub.sub.cancel();
    Ok(atoms::ok().encode(env))
}
