//! Lifecycle NIFs: `start/2`, `stop/1`, `stats/0`, `set_log_pid/1`, and
//! two test hooks: `test_panic/1` (proves that a panic on the runtime
//! still answers) and `test_thread_wait_ns/0` (the calling scheduler
//! thread's run-queue wait, for `couch_workers_sched_tests`).
//!
//! Their signatures, immediate answers and messages are listed once, in
//! the `@doc` of `src/couch_workers_nif.erl`.
//!
//! `Config` is a map; every key is optional:
//! `store => {embedded, DirBinary} | {fdb, ClusterFileBinary}`,
//! `runtime_threads => 1..256`, `reaper_max_interval_ms => pos_integer()`,
//! `tx_timeout_ms => pos_integer()`,
//! `embedded_safety_look_ms => 1..`[`MAX_SAFETY_LOOK_MS`] (the embedded
//! store's `EmbeddedOptions::safety_look`; ignored by the FDB store),
//! `node_name => binary()` (on FoundationDB, the name the job calls this
//! node relays inside callers' transactions are counted under:
//! `Node::count_tx_calls`; without it they are not counted).

use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Duration;

use couch_workers_core::log_event;
use couch_workers_core::Logger;
use couch_workers_core::{Node, Settings, StoreConfig};
use rustler::{Encoder, Env, Error, LocalPid, NifResult, Term};

use crate::atoms;
use crate::reply::{self, Replier};
use crate::runtime::{self, DEFAULT_THREADS, MAX_THREADS};
use crate::stats;
use crate::term::{bytes_arg, error_tuple};

/// The longest safety look accepted: a day. Far beyond any useful value,
/// and small enough that no deadline computed from it can overflow.
const MAX_SAFETY_LOOK_MS: u64 = 86_400_000;

/// What `start/2` was given, checked.
struct Config {
    store: StoreConfig,
    threads: usize,
    settings: Settings,
    /// Set on FoundationDB only (the one store of calls in callers'
    /// transactions).
    tx_counts_name: Option<Vec<u8>>,
}

/// `{error, {badconfig, Key}}`.
fn badconfig<'a>(env: Env<'a>, key: rustler::Atom) -> Term<'a> {
    (atoms::error(), (atoms::badconfig(), key)).encode(env)
}

fn decode_config<'a>(env: Env<'a>, term: Term<'a>) -> Result<Config, Term<'a>> {
    if !term.is_map() {
        return Err(badconfig(env, atoms::store()));
    }
    let safety_look_ms =
        positive(term, atoms::embedded_safety_look_ms(), StoreConfig::EMBEDDED_SAFETY_LOOK.as_millis() as u64)
            .filter(|ms| *ms <= MAX_SAFETY_LOOK_MS)
            .ok_or_else(|| badconfig(env, atoms::embedded_safety_look_ms()))?;
    let embedded = |dir: PathBuf| StoreConfig::embedded_with_safety_look(dir, Duration::from_millis(safety_look_ms));
    let store = match term.map_get(atoms::store()) {
        Err(_) => embedded(PathBuf::from("couch_workers_data")),
        Ok(t) => match t.decode::<(rustler::Atom, Term)>() {
            Ok((kind, path)) if kind == atoms::embedded() => {
                let dir = path_arg(path).ok_or_else(|| badconfig(env, atoms::store()))?;
                embedded(dir)
            }
            Ok((kind, path)) if kind == atoms::fdb() => {
                let cluster_file = path_arg(path).ok_or_else(|| badconfig(env, atoms::store()))?;
                StoreConfig::Fdb { cluster_file }
            }
            // The EUnit suites' FoundationDB store (StoreConfig::FdbTest):
            // `{fdb_test, File, Name}` owns its directory, `{fdb_test, File,
            // Name, shared}` joins another node's.
            _ => {
                let (kind, path, name, owner) = match t.decode::<(rustler::Atom, Term, Term)>() {
                    Ok((kind, path, name)) => (kind, path, name, true),
                    Err(_) => match t.decode::<(rustler::Atom, Term, Term, rustler::Atom)>() {
                        Ok((kind, path, name, shared)) if shared == atoms::shared() => (kind, path, name, false),
                        _ => return Err(badconfig(env, atoms::store())),
                    },
                };
                if kind != atoms::fdb_test() {
                    return Err(badconfig(env, atoms::store()));
                }
                let cluster_file = path_arg(path).ok_or_else(|| badconfig(env, atoms::store()))?;
                let name = bytes_arg(name)
                    .ok()
                    .filter(|n| !n.is_empty())
                    .and_then(|n| String::from_utf8(n.to_vec()).ok())
                    .ok_or_else(|| badconfig(env, atoms::store()))?;
                StoreConfig::FdbTest { cluster_file, name, owner }
            }
        },
    };
    let threads = positive(term, atoms::runtime_threads(), DEFAULT_THREADS as u64)
        .filter(|n| *n as usize <= MAX_THREADS)
        .ok_or_else(|| badconfig(env, atoms::runtime_threads()))? as usize;
    let defaults = Settings::default();
    let reaper_ms = positive(term, atoms::reaper_max_interval_ms(), defaults.reaper_max_interval.as_millis() as u64)
        .ok_or_else(|| badconfig(env, atoms::reaper_max_interval_ms()))?;
    let tx_ms = positive(term, atoms::tx_timeout_ms(), defaults.tx_timeout.as_millis() as u64)
        .ok_or_else(|| badconfig(env, atoms::tx_timeout_ms()))?;
    let settings = Settings {
        reaper_max_interval: Duration::from_millis(reaper_ms),
        tx_timeout: Duration::from_millis(tx_ms),
        ..defaults
    };
    let tx_counts_name = match term.map_get(atoms::node_name()) {
        Err(_) => None,
        Ok(t) => Some(bytes_arg(t).ok().filter(|n| !n.is_empty()).ok_or_else(|| badconfig(env, atoms::node_name()))?),
    }
    .filter(|_| matches!(store, StoreConfig::Fdb { .. } | StoreConfig::FdbTest { .. }))
    .map(<[u8]>::to_vec);
    Ok(Config { store, threads, settings, tx_counts_name })
}

/// A non-empty binary path.
fn path_arg(term: Term) -> Option<PathBuf> {
    let bytes = bytes_arg(term).ok()?;
    if bytes.is_empty() || bytes.contains(&0) {
        return None;
    }
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
}

/// The positive integer under `key`, `default` when absent, `None` when
/// it is something else.
fn positive(map: Term, key: rustler::Atom, default: u64) -> Option<u64> {
    match map.map_get(key) {
        Err(_) => Some(default),
        Ok(v) => v.decode::<u64>().ok().filter(|n| *n > 0),
    }
}

#[rustler::nif]
fn start<'a>(env: Env<'a>, reference: Term<'a>, config: Term<'a>) -> NifResult<Term<'a>> {
    if !reference.is_ref() {
        return Err(Error::BadArg);
    }
    let config = match decode_config(env, config) {
        Ok(c) => c,
        Err(reason) => return Ok(reason),
    };
    let (rt, honoured) = match runtime::ensure(config.threads) {
        Ok(r) => r,
        Err(why) => {
            log_event!(Logger::PROCESS, Error, "runtime_build_failed", reason = why.as_str());
            return Ok(error_tuple(env, "runtime_failed"));
        }
    };
    if !honoured {
        let running = runtime::threads().unwrap_or(0);
        log_event!(Logger::PROCESS, Notice, "runtime_threads_unchanged", requested = config.threads, running = running);
    }
    let guard = match runtime::begin_start() {
        Ok(g) => g,
        Err(e) => return Ok(error_tuple(env, e.name())),
    };
    let replier = Replier::new(env, reference);
    reply::spawn(rt.handle(), replier, async move {
        match Node::start(&config.store, config.settings, crate::log::sink()).await {
            Ok(node) => {
                if let Some(name) = &config.tx_counts_name {
                    node.count_tx_calls(name).await;
                }
                guard.complete(node);
                reply::ok()
            }
            Err(e) => {
                drop(guard);
                log_event!(Logger::PROCESS, Error, "node_start_failed", reason = %e);
                reply::error(e.name())
            }
        }
    });
    Ok(atoms::ok().encode(env))
}

#[rustler::nif]
fn stop<'a>(env: Env<'a>, reference: Term<'a>) -> NifResult<Term<'a>> {
    if !reference.is_ref() {
        return Err(Error::BadArg);
    }
    let guard = match runtime::begin_stop() {
        Ok(g) => g,
        Err(e) => return Ok(error_tuple(env, e.name())),
    };
    let rt = guard.node().runtime().clone();
    let replier = Replier::new(env, reference);
    reply::spawn(&rt, replier, async move {
        guard.node().stop().await;
        drop(guard);
        reply::ok()
    });
    Ok(atoms::ok().encode(env))
}

#[rustler::nif]
fn stats(env: Env) -> NifResult<Term> {
    let node = runtime::running().ok();
    let counts = node.as_ref().map(|n| n.stats());
    let jobs = node.as_ref().map(|n| n.jobs().stats());
    let pairs: Vec<(Term, Term)> = vec![
        (atoms::running().encode(env), node.is_some().encode(env)),
        (atoms::heartbeats().encode(env), counts.map_or(0, |c| c.heartbeats).encode(env)),
        (atoms::watchers().encode(env), counts.map_or(0, |c| c.watchers).encode(env)),
        (atoms::reapers().encode(env), counts.map_or(0, |c| c.reapers).encode(env)),
        (atoms::registrations().encode(env), stats::get(&stats::REGISTRATIONS).encode(env)),
        (atoms::watches().encode(env), stats::get(&stats::WATCHES).encode(env)),
        (atoms::job_dispatchers().encode(env), jobs.map_or(0, |j| j.dispatchers).encode(env)),
        (atoms::job_waiters().encode(env), jobs.map_or(0, |j| j.waiters).encode(env)),
        (atoms::job_watchers().encode(env), jobs.map_or(0, |j| j.job_watchers).encode(env)),
        (atoms::job_sweepers().encode(env), jobs.map_or(0, |j| j.sweepers).encode(env)),
        (atoms::job_subscriptions().encode(env), stats::get(&stats::JOB_SUBSCRIPTIONS).encode(env)),
        (atoms::accept_waiters().encode(env), stats::get(&stats::ACCEPT_WAITERS).encode(env)),
        (
            atoms::runtime_threads().encode(env),
            match runtime::threads() {
                Some(n) => n.encode(env),
                None => atoms::undefined().encode(env),
            },
        ),
    ];
    let (keys, values): (Vec<Term>, Vec<Term>) = pairs.into_iter().unzip();
    Term::map_from_term_arrays(env, &keys, &values)
}

#[rustler::nif]
fn set_log_pid<'a>(env: Env<'a>, pid: Term<'a>) -> NifResult<Term<'a>> {
    if pid == atoms::undefined().encode(env) {
        crate::log::set_pid(None);
    } else {
        let pid: LocalPid = pid.decode()?;
        crate::log::set_pid(Some(pid));
    }
    Ok(atoms::ok().encode(env))
}

/// `test_thread_wait_ns/0`: how long the calling thread has waited,
/// runnable, for a CPU since it started (ns; the second field of Linux's
/// `/proc/thread-self/schedstat`), or `undefined` where that file cannot be
/// read. `couch_workers_sched_tests` reads it on the scheduler thread just
/// before and after each timed NIF call and takes the difference out of
/// that call's wall time: time the OS gave the CPU to another thread is
/// not the NIF's, while the NIF's own work and any time it slept (a lock,
/// a syscall) stay counted. About 5-10 µs (an open and a read of a proc
/// file), outside the timed interval.
#[rustler::nif]
fn test_thread_wait_ns<'a>(env: Env<'a>) -> Term<'a> {
    match runqueue_wait_ns() {
        Some(ns) => ns.encode(env),
        None => atoms::undefined().encode(env),
    }
}

fn runqueue_wait_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    stat.split_ascii_whitespace().nth(1)?.parse().ok()
}

#[rustler::nif]
fn test_panic<'a>(env: Env<'a>, reference: Term<'a>) -> NifResult<Term<'a>> {
    if !reference.is_ref() {
        return Err(Error::BadArg);
    }
    let Some(rt) = runtime::handle() else {
        return Ok(error_tuple(env, "not_started"));
    };
    let replier = Replier::new(env, reference);
    reply::spawn(&rt, replier, async move {
        if std::hint::black_box(true) {
            panic!("couch_workers test panic");
        }
        reply::ok()
    });
    Ok(atoms::ok().encode(env))
}
