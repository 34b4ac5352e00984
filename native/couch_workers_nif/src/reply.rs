//! One reply per request, always.
//!
//! A NIF that has work for the store hands it to [`spawn`] with a
//! [`Replier`] made from the caller's reference, and returns at once. The
//! future runs on the runtime; whatever it ends with (an answer, or a
//! panic) becomes exactly one message `{Ref, Answer}` to the calling
//! process, built in an `OwnedEnv` on a runtime thread (never on a
//! scheduler: `send_and_clear` refuses those). Model: erlfdb's future
//! callback and `erlfdb:wait/2`.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use rustler::env::SavedTerm;
use rustler::{Encoder, Env, LocalPid, OwnedEnv, Term};
use tokio::runtime::Handle;

use crate::atoms;

/// The second element of a reply, encoded in the reply's environment.
pub type Answer = Box<dyn for<'a> FnOnce(Env<'a>) -> Term<'a> + Send>;

/// `ok`.
pub fn ok() -> Answer {
    Box::new(|env| atoms::ok().encode(env))
}

/// `{ok, Value}`.
pub fn ok_with<T: Encoder + Send + 'static>(value: T) -> Answer {
    Box::new(move |env| (atoms::ok(), value).encode(env))
}

/// `{error, Name}`, `Name` an atom (`Error::name()` of the core).
pub fn error(name: &'static str) -> Answer {
    Box::new(move |env| crate::term::error_tuple(env, name))
}

/// `{error, {panic, Message}}`.
pub fn panicked(message: String) -> Answer {
    Box::new(move |env| (atoms::error(), (atoms::panic(), message.as_str())).encode(env))
}

/// The message of a panic payload.
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

/// Where and how to answer one request: the caller's pid and a copy of
/// its reference, kept in an environment of their own.
pub struct Replier {
    env: OwnedEnv,
    reference: SavedTerm,
    pid: LocalPid,
    sent: bool,
}

impl Replier {
    /// A replier to the calling process with `reference`.
    pub fn new(env: Env, reference: Term) -> Replier {
        let owned = OwnedEnv::new();
        let saved = owned.save(reference);
        Replier { env: owned, reference: saved, pid: env.pid(), sent: false }
    }

    /// Sends `{Ref, Answer}`. Must run off the scheduler threads. A panic
    /// while encoding the answer still gets a reply.
    pub fn send(mut self, answer: Answer) {
        self.send_inner(answer);
    }

    /// [`Replier::send`], and whether `answer` itself reached a live
    /// process: false when the caller is gone, or when encoding `answer`
    /// panicked (the caller then got `{error, {panic, Msg}}` instead).
    pub fn send_checked(mut self, answer: Answer) -> bool {
        self.send_inner(answer)
    }

    /// Drops the replier without answering (the caller said it no longer
    /// waits, so an answer would only litter its mailbox).
    pub fn discard(mut self) {
        self.sent = true;
    }

    fn send_inner(&mut self, answer: Answer) -> bool {
        if self.sent {
            return false;
        }
        self.sent = true;
        let reference = self.reference.clone();
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
            self.env.send_and_clear(&self.pid, |env| (reference.load(env), answer(env)).encode(env))
        }));
        couch_workers_core::stage_mark("reply_sent");
        match result {
            Ok(sent) => sent.is_ok(),
            Err(payload) => {
                // The closure panicked before the send: the environment (and
                // the saved reference in it) is intact.
                let message = panic_message(payload.as_ref());
                let fallback = panicked(message);
                let reference = self.reference.clone();
                let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    self.env.send_and_clear(&self.pid, |env| (reference.load(env), fallback(env)).encode(env))
                }));
                false
            }
        }
        // A dead caller (`Err(SendError)`) needs no answer.
    }
}

impl Drop for Replier {
    fn drop(&mut self) {
        // Only a future dropped before completion gets here unsent (the
        // runtime never shuts down, so that is a bug); still answer, when
        // the thread allows it.
        if !self.sent && !rustler::thread::is_scheduler_thread() {
            let _ = self.send_inner(error("dropped"));
        }
    }
}

/// Runs `work` on the runtime and answers with its outcome; a panic in it
/// answers `{error, {panic, Message}}`.
pub fn spawn<F>(runtime: &Handle, replier: Replier, work: F)
where
    F: Future<Output = Answer> + Send + 'static,
{
    runtime.spawn(async move {
        let answer = match AssertUnwindSafe(work).catch_unwind().await {
            Ok(answer) => answer,
            Err(payload) => panicked(panic_message(payload.as_ref())),
        };
        replier.send(answer);
    });
}
