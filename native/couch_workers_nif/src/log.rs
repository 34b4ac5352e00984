//! Log events of the core and of this crate, forwarded to Erlang's `logger`.
//!
//! The core never prints. Its events and this crate's go through
//! `tracing` (`log_event!`, see the core's `log.rs`), whose one layer hands
//! each to a sink: the node's and the process's are both [`ErlangSink`].
//! Rust panics reach it too, through a panic hook that replaces the default
//! one (which would print to stderr). Each event is sent as
//! `{couch_workers_log, Level, What, Fields}` to the process set with
//! `set_log_pid/1` (`couch_workers_events`), which calls
//! `logger:log(Level, Fields#{what => What})`. `Level` is one of `debug`,
//! `info`, `notice`, `warning`, `error`; `Fields` is a map with atom keys
//! and binary or integer values. With no such process, events are dropped.

use std::sync::{Arc, Once, RwLock};

use couch_workers_core::log_event;
use couch_workers_core::{set_process_sink, Event, Level, Logger, Sink, Value};
use rustler::{Encoder, Env, LocalPid, OwnedEnv, Term};

use crate::atoms;
use crate::term::{atom, binary};

static LOG_PID: RwLock<Option<LocalPid>> = RwLock::new(None);

/// Sets (or, with `None`, clears) the process that receives log events.
pub fn set_pid(pid: Option<LocalPid>) {
    *LOG_PID.write().unwrap_or_else(|p| p.into_inner()) = pid;
}

fn pid() -> Option<LocalPid> {
    *LOG_PID.read().unwrap_or_else(|p| p.into_inner())
}

/// The sink of every event: the node's (`Node::start`) and the process's.
pub struct ErlangSink;

impl Sink for ErlangSink {
    fn log(&self, event: Event) {
        emit(event);
    }
}

/// The sink for `Node::start`.
pub fn sink() -> Arc<dyn Sink> {
    Arc::new(ErlangSink)
}

/// Sends `event` to the log process. Off the scheduler threads it is sent
/// at once; on one (a NIF, a resource destructor) it is handed to the
/// runtime, since an `OwnedEnv` cannot send from a scheduler.
fn emit(event: Event) {
    let Some(pid) = pid() else { return };
    if rustler::thread::is_scheduler_thread() {
        if let Some(rt) = crate::runtime::handle() {
            rt.spawn(async move { send(&pid, &event) });
        }
        return;
    }
    send(&pid, &event);
}

fn send(pid: &LocalPid, event: &Event) {
    let mut env = OwnedEnv::new();
    let _ = env.send_and_clear(pid, |env| encode(env, event));
}

fn encode<'a>(env: Env<'a>, event: &Event) -> Term<'a> {
    let mut fields = rustler::types::map::map_new(env);
    for (key, value) in &event.fields {
        let v = match value {
            Value::Bytes(b) => binary(env, b),
            Value::Str(s) => binary(env, s.as_bytes()),
            Value::Int(i) => i.encode(env),
        };
        fields = fields.map_put(atom(env, key), v).unwrap_or(fields);
    }
    (atoms::couch_workers_log(), atom(env, level_name(event.level)), atom(env, event.what), fields).encode(env)
}

fn level_name(level: Level) -> &'static str {
    level.name()
}

/// Sends the events that belong to no node (this crate's own, panics) to
/// Erlang too; and routes Rust panics to the log (as `rust_panic` events
/// at `error`) instead of stderr. The panic itself still unwinds to
/// whoever catches it: rustler turns a NIF's into an exception,
/// `reply.rs` a task's into `{error, {panic, Msg}}`.
pub fn install() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        set_process_sink(Some(sink()));
        std::panic::set_hook(Box::new(|info| {
            let message = crate::reply::panic_message(info.payload());
            let location = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
            let thread = std::thread::current().name().unwrap_or("unnamed").to_string();
            log_event!(Logger::PROCESS, Error, "rust_panic", message = message, location = location, thread = thread);
        }));
    });
}
