//! The global native state of one Erlang VM: the tokio runtime and the node.
//!
//! * One runtime per VM, built once, on the first `start`, with named
//!   threads (`cw-runtime`) and an explicit worker count. It is never
//!   dropped: a restart of the application reuses it, and since the library
//!   is never unloaded, neither are its threads.
//! * The node is a small state machine with explicit transitions
//!   (foundationdb-rs `NetworkLifecycle`):
//!
//!   ```text
//!   Stopped --start--> Starting --opened--> Running(node) --stop--> Stopping --stopped--> Stopped
//!                          \--failed------------------------------------------------------/
//!   ```
//!
//!   A `start` in any state but `Stopped` is `{error, already_started}`
//!   (`stopping` while a stop is in progress); a `stop` of a node that is
//!   not running is `{error, not_started}`.
//!
//! ## Why the runtime threads are `SCHED_BATCH` (Linux)
//!
//! Every NIF that touches the store hands its work to the runtime, which
//! wakes a parked runtime thread (a futex wake inside `spawn`, still on
//! the calling scheduler thread, still inside the NIF). With the default
//! policy Linux lets the woken thread preempt the waker at once when it
//! lands on the waker's CPU; the woken thread then runs the request to
//! its end (for a job near the value limit: reading it and building a
//! 100 KB reply term, milliseconds), while the scheduler thread waits, runnable,
//! in the middle of a NIF call that needs microseconds of CPU (a perf
//! trace of `sched_switch` showed the scheduler thread switched out inside
//! that futex wake; figures in bench/RESULTS.md, "Figures the module docs
//! rely on", and docs/reliability.md). `SCHED_BATCH` changes
//! only that: a woken batch thread never preempts on wakeup (it runs on a
//! free CPU, or
//! when the running thread's slice ends) and keeps its nice-0 share of
//! the CPU.
//! Tokio calls the hook for its worker and blocking threads alike; threads
//! that the store starts from a runtime thread (the embedded store's
//! watcher and checkpoint threads) inherit the policy, which suits them:
//! no scheduler thread wakes them. A failure (not Linux, a seccomp
//! filter) leaves the default policy. test/couch_workers_sched_tests.erl
//! checks the policy.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use couch_workers_core::Node;
use tokio::runtime::{Builder, Handle, Runtime};

/// Name of every runtime thread (`ps -L`, `top -H`, gdb).
pub const THREAD_NAME: &str = "cw-runtime";

/// Worker threads when the application does not say.
pub const DEFAULT_THREADS: usize = 2;

/// Most worker threads accepted (a typo guard, not a tuning limit).
pub const MAX_THREADS: usize = 256;

static RUNTIME: OnceLock<Runtime> = OnceLock::new();
static BUILD: Mutex<()> = Mutex::new(());
static THREADS: OnceLock<usize> = OnceLock::new();

/// The runtime, built now with `threads` workers if it does not exist yet.
/// Returns the runtime and whether `threads` was honoured (false when an
/// earlier start built it with another count).
pub fn ensure(threads: usize) -> Result<(&'static Runtime, bool), String> {
    if let Some(rt) = RUNTIME.get() {
        return Ok((rt, THREADS.get() == Some(&threads)));
    }
    let _guard = lock(&BUILD);
    if let Some(rt) = RUNTIME.get() {
        return Ok((rt, THREADS.get() == Some(&threads)));
    }
    let rt = Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(THREAD_NAME)
        .on_thread_start(batch_policy)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot build the tokio runtime: {e}"))?;
    let _ = THREADS.set(threads);
    let _ = RUNTIME.set(rt);
    Ok((RUNTIME.get().expect("runtime just set"), true))
}

/// Puts the calling thread under `SCHED_BATCH` (see the module doc):
/// waking it never preempts a scheduler thread.
#[cfg(target_os = "linux")]
fn batch_policy() {
    // From <sched.h>; std links libc, and the NIF crate has no libc
    // dependency of its own for three lines.
    #[repr(C)]
    struct SchedParam {
        sched_priority: i32,
    }
    const SCHED_BATCH: i32 = 3;
    extern "C" {
        fn sched_setscheduler(pid: i32, policy: i32, param: *const SchedParam) -> i32;
    }
    let param = SchedParam { sched_priority: 0 };
    // pid 0: the calling thread. Unprivileged, and allowed for any thread
    // of one's own. A failure keeps the default policy: slower worst
    // cases, nothing wrong.
    // SAFETY: a plain syscall wrapper given a valid pointer to a
    // `struct sched_param` that outlives the call.
    let _ = unsafe { sched_setscheduler(0, SCHED_BATCH, &param) };
}

#[cfg(not(target_os = "linux"))]
fn batch_policy() {}

/// The runtime's handle, if it was built.
pub fn handle() -> Option<Handle> {
    RUNTIME.get().map(|rt| rt.handle().clone())
}

/// The worker count the runtime was built with.
pub fn threads() -> Option<usize> {
    THREADS.get().copied()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves a consistent state (every
    // transition is one assignment), so poisoning is ignored.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

// ---- the node state machine ------------------------------------------------

enum NodeState {
    Stopped,
    Starting,
    Running(Arc<Node>),
    Stopping,
}

static STATE: Mutex<NodeState> = Mutex::new(NodeState::Stopped);

/// Why a transition was refused; `name` is the atom Erlang sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateError {
    AlreadyStarted,
    NotStarted,
    Starting,
    Stopping,
}

impl StateError {
    pub fn name(self) -> &'static str {
        match self {
            StateError::AlreadyStarted => "already_started",
            StateError::NotStarted => "not_started",
            StateError::Starting => "starting",
            StateError::Stopping => "stopping",
        }
    }
}

/// The running node, or why there is none.
pub fn running() -> Result<Arc<Node>, StateError> {
    match &*lock(&STATE) {
        NodeState::Running(node) => Ok(node.clone()),
        NodeState::Stopped => Err(StateError::NotStarted),
        NodeState::Starting => Err(StateError::Starting),
        NodeState::Stopping => Err(StateError::Stopping),
    }
}

/// Claims `Stopped -> Starting`. The guard moves on to `Running` with
/// [`StartGuard::complete`]; dropped without it (the open failed, or the
/// task panicked), it goes back to `Stopped`.
pub fn begin_start() -> Result<StartGuard, StateError> {
    let mut state = lock(&STATE);
    match &*state {
        NodeState::Stopped => {
            *state = NodeState::Starting;
            Ok(StartGuard { done: false })
        }
        NodeState::Starting | NodeState::Running(_) => Err(StateError::AlreadyStarted),
        NodeState::Stopping => Err(StateError::Stopping),
    }
}

pub struct StartGuard {
    done: bool,
}

impl StartGuard {
    pub fn complete(mut self, node: Arc<Node>) {
        *lock(&STATE) = NodeState::Running(node);
        self.done = true;
    }
}

impl Drop for StartGuard {
    fn drop(&mut self) {
        if !self.done {
            *lock(&STATE) = NodeState::Stopped;
        }
    }
}

/// Claims `Running -> Stopping` and hands out the node to stop. The guard
/// moves on to `Stopped` when dropped, whatever happened to the stop: the
/// node's tasks were cancelled, and a node is never started twice.
pub fn begin_stop() -> Result<StopGuard, StateError> {
    let mut state = lock(&STATE);
    match std::mem::replace(&mut *state, NodeState::Stopping) {
        NodeState::Running(node) => Ok(StopGuard { node }),
        other => {
            let err = match other {
                NodeState::Stopped => StateError::NotStarted,
                NodeState::Starting => StateError::Starting,
                _ => StateError::Stopping,
            };
            *state = other;
            Err(err)
        }
    }
}

pub struct StopGuard {
    node: Arc<Node>,
}

impl StopGuard {
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }
}

impl Drop for StopGuard {
    fn drop(&mut self) {
        *lock(&STATE) = NodeState::Stopped;
    }
}
