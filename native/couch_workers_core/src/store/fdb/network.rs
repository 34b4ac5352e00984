//! The FoundationDB client network: booted once per OS process, stopped
//! once, never restarted; or, when another client of the process (erlfdb)
//! booted it first, shared and left to that client.
//!
//! libfdb_c runs one network thread per process. `fdb_select_api_version`
//! and `fdb_setup_network` may each be called once, and after
//! `fdb_stop_network` the network cannot be started again in the same
//! process. This module keeps that as a small state machine, in the spirit
//! of foundationdb-rs `api.rs` (`NetworkAutoStop`):
//!
//! ```text
//! Unbooted ──ensure_running──► Running ──shutdown_network──► Stopped (terminal)
//!    │  │                                                    ▲
//!    │  └──(2201 / 2009: erlfdb got there first)──► Shared ──┘ (network left running)
//!    └──select_api_version / setup_network fails──► Failed(message) (terminal)
//! ```
//!
//! The decision on libfdb_c's answers is `store::fdb_client` (tested without
//! the feature). A network this module started is stopped by
//! [`shutdown_network`], which also runs from an exit handler registered at
//! boot (`atexit`): libfdb_c's documentation requires the stop before the
//! process exits. A shared network belongs to its owner: erlfdb stops it in
//! its NIF's unload.
//!
//! Unlike `NetworkAutoStop`, whose `drop` aborts the process when
//! `fdb_stop_network` fails, a failed stop here only records the failure:
//! this code runs inside the Erlang VM, which must never be brought down.

use std::sync::{LazyLock, Mutex, MutexGuard};
use std::thread::JoinHandle;

use foundationdb::api::{get_max_api_version, FdbApiBuilder, NetworkStop};
use foundationdb::options::NetworkOption;
use foundationdb::FdbResult;
use tokio_util::sync::CancellationToken;

use super::map_fdb_error;
use crate::store::fdb_client::{after_select, after_setup, AfterSelect, AfterSetup};
use crate::store::StoreError;

/// The FoundationDB API version this crate selects (cargo feature
/// `fdb-7_1` of the `foundationdb` crate). Needs libfdb_c 7.1 or newer.
pub const API_VERSION: i32 = 710;

/// The client knob set when this module boots the network. A watch that
/// fires is handed to the client only once a read version at or past the
/// change's version comes back; the storage server can see a commit before
/// the commit proxy has reported it (the log servers unblock their
/// readers before their own disk write is done), and libfdb_c then sleeps
/// `future_version_retry_delay` (0.01 s by default) before it asks again:
/// about half the watches on a local cluster fired 10 ms late. At 1 ms
/// the wait is one extra read-version request per millisecond, a few at
/// most (the log's disk write takes about that long). The same knob is
/// the pause before a read retries `future_version`, where 1 ms is as
/// harmless. Not set when the operator's `FDB_NETWORK_OPTION_KNOB`
/// environment variable (which libfdb_c applies at set-up) names the
/// knob; a network that erlfdb booted first keeps erlfdb's knobs
/// (`docs/fdb.md`).
pub const WATCH_CONFIRM_KNOB: &str = "future_version_retry_delay=0.001";

/// Whether the operator's `FDB_NETWORK_OPTION_KNOB` value sets the knob
/// of [`WATCH_CONFIRM_KNOB`] (libfdb_c accepts `-` or `_` in knob names).
fn operator_sets_knob(env: Option<&str>) -> bool {
    let name = |k: &str| k.split('=').next().unwrap_or("").trim().to_ascii_lowercase().replace('-', "_");
    env.is_some_and(|v| name(v) == name(WATCH_CONFIRM_KNOB))
}

/// Where the network of this OS process is in its life (for the tests).
#[cfg(any(test, feature = "internals"))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetworkStatus {
    /// Not started yet: the first [`super::FdbStore::open`] starts it.
    Unbooted,
    /// The network thread runs, started by couch_workers.
    Running,
    /// Another client of this process (erlfdb) selected the API version and
    /// runs the network; couch_workers uses it and never stops it.
    Shared,
    /// [`shutdown_network`] stopped it; it cannot run again in this process.
    Stopped,
    /// Booting or stopping failed; the message says why.
    Failed(String),
}

struct Running {
    stop: NetworkStop,
    thread: JoinHandle<FdbResult<()>>,
}

enum Lifecycle {
    Unbooted,
    Running(Running),
    Shared,
    Stopped,
    Failed(String),
}

static NETWORK: Mutex<Lifecycle> = Mutex::new(Lifecycle::Unbooted);

/// Cancelled by [`shutdown_network`]. Every store's token is a child of
/// it, so pending reads, commits and watches end with `Closed` instead of
/// waiting forever on a network thread that is gone.
static SHUTDOWN: LazyLock<CancellationToken> = LazyLock::new(CancellationToken::new);

fn lock() -> MutexGuard<'static, Lifecycle> {
    // Every transition is one assignment, so a panic elsewhere while the
    // lock was held cannot leave a torn state: poisoning is ignored.
    NETWORK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

const STOPPED_MESSAGE: &str = "the FoundationDB client network of this OS process was stopped \
     (shutdown_network); FoundationDB cannot restart it in the same process: restart the Erlang VM";

/// Boots the network on first use; afterwards a no-op. Fails, saying why,
/// once the network was stopped or failed to boot.
pub(super) fn ensure_running() -> Result<(), StoreError> {
    let mut state = lock();
    match &*state {
        Lifecycle::Running(_) | Lifecycle::Shared => Ok(()),
        Lifecycle::Stopped => Err(StoreError::Invalid(STOPPED_MESSAGE.into())),
        Lifecycle::Failed(message) => Err(StoreError::Invalid(message.clone())),
        Lifecycle::Unbooted => match boot() {
            Ok(Booted::Owned(running)) => {
                *state = Lifecycle::Running(running);
                if let Err(message) = stop_at_exit() {
                    drop(state);
                    shutdown_network();
                    *lock() = Lifecycle::Failed(message.clone());
                    return Err(StoreError::Invalid(message));
                }
                Ok(())
            }
            Ok(Booted::Shared) => {
                *state = Lifecycle::Shared;
                Ok(())
            }
            Err(message) => {
                *state = Lifecycle::Failed(message.clone());
                Err(StoreError::Invalid(message))
            }
        },
    }
}

enum Booted {
    Owned(Running),
    Shared,
}

fn boot() -> Result<Booted, String> {
    // Checked first: FdbApiBuilder::build prints to stdout when the library
    // is too old, and a NIF must not write to the VM's stdout.
    let max = get_max_api_version();
    if max < API_VERSION {
        return Err(format!(
            "the installed libfdb_c supports FoundationDB API versions up to {max}, couch_workers \
             selects {API_VERSION}: install the FoundationDB client library 7.1 or newer"
        ));
    }
    let select = FdbApiBuilder::default().set_runtime_version(API_VERSION).build();
    let builder = match after_select(select.as_ref().err().map_or(0, |e| e.code()), API_VERSION) {
        AfterSelect::SetUpNetwork => select.map_err(|e| format!("FoundationDB: {}", map_fdb_error(e)))?,
        AfterSelect::UseShared => return Ok(Booted::Shared),
        AfterSelect::Fail(message) => return Err(message),
    };
    let builder = if operator_sets_knob(std::env::var("FDB_NETWORK_OPTION_KNOB").ok().as_deref()) {
        builder
    } else {
        builder
            .set_option(NetworkOption::Knob(WATCH_CONFIRM_KNOB.into()))
            .map_err(|e| format!("FoundationDB: setting the client knob {WATCH_CONFIRM_KNOB}: {}", map_fdb_error(e)))?
    };
    let setup = builder.build();
    let (runner, ready) = match after_setup(setup.as_ref().err().map_or(0, |e| e.code())) {
        AfterSetup::RunOwned => setup.map_err(|e| format!("FoundationDB: {}", map_fdb_error(e)))?,
        AfterSetup::UseShared => return Ok(Booted::Shared),
        AfterSetup::Fail(message) => return Err(message),
    };
    let thread = std::thread::Builder::new()
        .name("fdb-network".into())
        // SAFETY: `NetworkRunner::run` requires that `NetworkStop::stop` is
        // called before the process exits: `shutdown_network` does, from
        // the exit handler `ensure_running` registers right after this boot
        // (and earlier when the NIF or a test calls it).
        .spawn(move || unsafe { runner.run() })
        .map_err(|e| format!("spawning the FoundationDB network thread failed: {e}"))?;
    let stop = ready.wait();
    Ok(Booted::Owned(Running { stop, thread }))
}

/// The exit handler. It stops the network from a thread of its own:
/// `exit(3)` destroys the exiting thread's C++ `thread_local`s before it
/// runs the handlers, and libfdb_c's stop uses its per-thread state on the
/// calling thread, so `fdb_stop_network` called on the exiting thread
/// itself jumps through a destroyed object (a SIGSEGV at the end of every
/// test binary that used FoundationDB, seen with 7.1.67).
extern "C" fn shutdown_network_at_exit() {
    let stopper = std::thread::Builder::new().name("fdb-stop".into()).spawn(shutdown_network);
    match stopper {
        Ok(handle) => {
            // A panic there is already recorded as the network's failure.
            let _ = handle.join();
        }
        // No thread to stop it from: leave the network to the exit (the
        // state says so for anyone still looking).
        Err(_) => *lock() = Lifecycle::Failed("no thread to stop the FoundationDB network at exit".into()),
    }
}

/// Registers [`shutdown_network`] to run when the process exits (`exit(3)`:
/// the end of `erlang:halt/0,1` and of `init:stop/0`, and of a test
/// binary). Registered before the network boots, so a network never runs
/// without it; with a shared or no network the handler does nothing. On
/// glibc a handler registered from a shared object (the NIF library) also
/// runs when that object is unloaded (`__cxa_finalize` at `dlclose`), so it
/// never outlives its code.
fn stop_at_exit() -> Result<(), String> {
    // SAFETY: registers a plain `extern "C"` function without state.
    match unsafe { libc::atexit(shutdown_network_at_exit) } {
        0 => Ok(()),
        _ => Err("cannot register the exit handler that stops the FoundationDB network (atexit failed): \
                  the network is not started"
            .into()),
    }
}

/// A token cancelled when the network stops; each store derives its own.
pub(super) fn shutdown_token() -> CancellationToken {
    SHUTDOWN.child_token()
}

/// Stops the FoundationDB client network of this OS process and joins its
/// thread. Pending store operations and watches end with
/// [`StoreError::Closed`], and every later [`super::FdbStore::open`] fails:
/// FoundationDB cannot restart its network in one process.
///
/// Call it once, after the stores are closed: from the NIF's `unload`
/// callback, or at the end of a test binary. Idempotent. When stopping
/// fails, the failure is kept in [`network_status`] and the thread is left
/// alone (never an abort).
pub fn shutdown_network() {
    SHUTDOWN.cancel();
    let mut state = lock();
    match std::mem::replace(&mut *state, Lifecycle::Stopped) {
        Lifecycle::Running(Running { stop, thread }) => match stop.stop() {
            Ok(()) => match thread.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    *state =
                        Lifecycle::Failed(format!("the FoundationDB network thread ended with: {}", map_fdb_error(e)))
                }
                Err(_) => *state = Lifecycle::Failed("the FoundationDB network thread panicked".into()),
            },
            Err(e) => {
                *state =
                    Lifecycle::Failed(format!("stopping the FoundationDB client network failed: {}", map_fdb_error(e)))
            }
        },
        Lifecycle::Failed(message) => *state = Lifecycle::Failed(message),
        // erlfdb's network: its owner stops it (erlfdb's NIF unload).
        Lifecycle::Unbooted | Lifecycle::Shared | Lifecycle::Stopped => {}
    }
}

/// The state of this process's FoundationDB network, for the tests.
#[cfg(any(test, feature = "internals"))]
pub fn network_status() -> NetworkStatus {
    match &*lock() {
        Lifecycle::Unbooted => NetworkStatus::Unbooted,
        Lifecycle::Running(_) => NetworkStatus::Running,
        Lifecycle::Shared => NetworkStatus::Shared,
        Lifecycle::Stopped => NetworkStatus::Stopped,
        Lifecycle::Failed(message) => NetworkStatus::Failed(message.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::operator_sets_knob;

    #[test]
    fn an_operators_value_of_the_knob_is_left_to_libfdb_c() {
        assert!(operator_sets_knob(Some("future_version_retry_delay=0.005")));
        assert!(operator_sets_knob(Some("FUTURE-VERSION-RETRY-DELAY=0.02")));
        assert!(!operator_sets_knob(Some("max_batch_size=10")));
        assert!(!operator_sets_knob(None));
    }
}
