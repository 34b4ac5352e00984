//! The NIF boundary of couch_workers: terms in, messages out.
//!
//! Every module here is thin. Argument shapes are checked on the calling
//! scheduler (a wrong shape raises `badarg`); anything that touches the
//! store runs on the one tokio runtime of the VM and answers the calling
//! process with exactly one `{Ref, Result}` message (see `reply.rs`).
//! All logic worth a unit test lives in `couch_workers_core`.
//!
//! The protocol (every NIF's arguments, immediate answers and messages) is
//! described once, in the `@doc` of `src/couch_workers_nif.erl`, the stubs
//! Erlang calls; the modules here document only what that list does not.
//!
//! A NIF never holds a normal scheduler long (1 ms at most). The NIFs
//! that convert a caller's map to JSON (up to 100 KB of terms) do so on
//! the calling scheduler only within a budget of terms, and answer
//! `dirty` past it; their `_dirty` twins (DirtyCpu) convert any size
//! (`json.rs`). `job_add_many/3` always runs on a dirty scheduler. The
//! runtime threads that NIFs wake are `SCHED_BATCH`, so that waking one
//! never preempts the scheduler thread still inside the NIF
//! (`runtime.rs`).
//!
//! | module          | NIFs                                                    |
//! | --------------- | ------------------------------------------------------- |
//! | `node.rs`       | `start/2`, `stop/1`, `stats/0`, `set_log_pid/1`, `test_panic/1`, `test_thread_wait_ns/0` |
//! | `workers.rs`    | `worker_register/4` (and `_dirty`), `worker_unregister/2`, `worker_notify/3` |
//! | `membership.rs` | `membership_watch/2`, `membership_unwatch/1`            |
//! | `ops.rs`        | `ops_worker_types/1`, `ops_workers/2`, `ops_job_paused/2`, `ops_store_counters/0` |
//! | `jobs/`         | `calls.rs`: `job_add/5`, `job_add_many/3`, `job_update/3`, `job_finish/3`, `job_fail/4`, `job_release/4`, `job_resubmit/6` (each with a `_dirty` twin; `job_add_many/3` always runs dirty), `job_cancel/3`, `job_remove/3`, `job_remove_if/4`, `job_get/3`, `job_pending_count/2`, `job_counts/2`, `job_types/1`, `job_list/5`, `job_set_paused/3`; `accept.rs`: `job_accept/4`, `job_accept_abandon/1`; `subscribe.rs`: `job_subscribe/5`, `job_unsubscribe/1`; `in_tx.rs`: `job_tx_session/1`, `job_tx_add/6`, `job_tx_update/4`, `job_tx_finish/4`, `job_tx_resubmit/7` (each with a `_dirty` twin), `job_tx_get/4`, `job_tx_remove/5`, `job_tx_cancel/4`, `job_tx_answer/3` (and `_dirty`), `job_tx_close/1`, `test_tx_call/0` |

mod atoms;
mod jobs;
mod json;
mod leader;
mod log;
mod membership;
mod node;
mod ops;
mod reply;
mod runtime;
mod stats;
mod term;
mod workers;

use rustler::{Env, Term};

/// The NIF's allocations (tasks, boxed answers, keys, records) go to
/// mimalloc instead of the C library's malloc: per-thread free lists
/// without glibc's arena locking (measured: bench/RESULTS.md, J2 with
/// mimalloc, 2 Dec 2026).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn load(env: Env, _info: Term) -> bool {
    log::install();
    // Resource types: each module registers its own.
    workers::load(env) && membership::load(env) && jobs::load(env)
}

rustler::init!("couch_workers_nif", load = load);
