//! The accept dispatcher: one per (node, job type) while acceptors wait.
//!
//! couch_jobs has every waiting acceptor hold its own watch on the type's
//! pending key and retry its own accept transaction when it fires: one
//! added job wakes every acceptor in the cluster (a thundering herd), all
//! of them race for it, all but one conflict and retry. To dodge the
//! conflicts it takes a *random* job among the first 1024 pending ones,
//! which gives up first-in-first-out order, and its accept loop restarts
//! the full timeout after each wake-up.
//!
//! Here a node has at most one waiting store watch per job type, whatever
//! the number of acceptors:
//!
//! * acceptors that wait (timeout > 0) join the dispatcher's FIFO of
//!   waiters (worker id, the incarnation it accepts for, deadline, reply);
//! * when a waiter arrives or the type's `jobs_vs` watch fires, the
//!   dispatcher runs one accept round
//!   ([`ops::accept`](super::ops::accept)): one transaction takes up to
//!   one job per waiter, in queue order, for up to
//!   [`ROUND_MAX_WAITERS`] waiters; if waiters are left, it reads
//!   `jobs_vs` as a snapshot and, after its commit, arms the watch in a
//!   read-only transaction that reads the key again: if it moved in
//!   between, another round follows at once, so no add slips between the
//!   round and the watch. Not in the round's own transaction: on
//!   FoundationDB creating a watch is a read with a conflict range, and
//!   every add writes `jobs_vs`, so each add would abort a round that
//!   took jobs (`tests/sim_accept_watch.rs`);
//! * while the rounds find jobs for every waiter they serve, the next round
//!   follows at once: waiters past the first [`ROUND_MAX_WAITERS`] are
//!   served from the jobs already pending, which fire no watch;
//! * scheduled jobs: each round also reads the earliest `run_at` of the
//!   type's scheduled jobs, and the dispatcher arms one timer for it (per
//!   node and type, on this node's wall clock). When it fires, a round
//!   takes the due jobs for its waiters straight from the scheduled keys
//!   (one transaction); then, after the deliveries, due jobs that no
//!   waiter took are moved to pending
//!   ([`ops::promote_due`](super::ops::promote_due)). A job scheduled
//!   earlier than every other bumps
//!   `jobs_vs`, so the round it causes re-arms the timer; no scan runs on
//!   a fixed interval. A job is never taken before its `run_at` by the
//!   clock of the node that moves it;
//! * while the type is paused (a flag every round reads), rounds take
//!   nothing and the watch stays armed: `job_resume/1` bumps `jobs_vs`,
//!   which wakes every node's dispatcher at once;
//! * while a running limit of the type (`max_running`,
//!   `max_running_per_group`) holds jobs back from the waiters left, the
//!   watch also covers the type's running counter, which every run's end
//!   moves (on any node, failover included): the next round follows the
//!   end at once. A change of a limit bumps `jobs_vs`, so a raised limit
//!   serves the waiters at once too;
//! * at the handle's watch limit (`too_many_watches`) the dispatcher
//!   polls instead, with the growing pause of `tasks::watch_limit`
//!   (not a write round every 50 ms); arriving waiters are still served
//!   at once;
//! * a waiter whose deadline passes gets `not_found`; an accept with
//!   timeout 0 never comes here (one transaction, no dispatcher);
//! * while nothing happens the dispatcher sleeps on its watch, the timer
//!   of the earliest scheduled job and its waiters' deadlines, nothing
//!   else: a waiter's reply rings it when the acceptor goes away
//!   ([`AcceptReply::signal_gone`]), so no timer looks for gone waiters
//!   (one that cannot ring is looked at every [`PRUNE_INTERVAL`]);
//! * when no waiter is left the dispatcher exits (it is started again on
//!   demand), and it stops with the node (a child of the node's token),
//!   answering its waiters `store_closed`.
//!
//! Across nodes, dispatchers that take the same job conflict and one
//! retries: contention grows with the number of nodes, not of acceptors.
//! The retry starts at a random job a little down the queue (of the
//! head's priority; `ops::accept`'s `spread`), so that a node's round
//! cannot lose the head to the other nodes' until its budget ends (its
//! waiters would get `not_found` while jobs wait). Jobs keep their order
//! within that window. On one node, the round and the workers' own takes
//! (`job_finish_accept/3`, `job_accept/2` with timeout 0) claim the jobs
//! they take (`ops::Claims`) and pass over each other's: they share the
//! head instead of racing for it.
//!
//! A waiter that goes away must not lose a job. The dispatcher asks each
//! waiter whether it still waits ([`AcceptReply::is_waiting`]) right
//! before the round that could take a job for it, and skips it if not.
//! That cannot be airtight (it may go between the check and the commit),
//! so a delivery that fails ([`AcceptReply::deliver`] returns false)
//! releases the job: back to pending exactly as on failover, in its own
//! transaction, if that accept still holds it. A release the store fails
//! (a stall) is retried with backoff until it lands, in a task of its own
//! (`dispatcher::release`): the job
//! would otherwise stay running for a live worker that never got it.
//!
//! The files: `registry` (the node's dispatchers by type: a waiter's way
//! in, a dispatcher's start), `task` (a dispatcher's loop: waiters, watch,
//! timer), `round` (one accept round and its deliveries), `hand_over`
//! (what a run that panics leaves the next one), `give_back` (jobs a take
//! could not hand out), `waiter` (a waiting acceptor and where its answer
//! goes). [`Dispatcher`], below, is the state they all work on.

mod give_back;
mod hand_over;
mod registry;
mod round;
mod task;
mod waiter;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use super::job::AcceptToken;
use crate::context::Context;
use hand_over::Parked;

pub(crate) use give_back::{log_unrunnable, reclaim, release};
pub(crate) use registry::Dispatchers;
#[cfg(feature = "internals")]
pub use waiter::ReplyFn;
pub(crate) use waiter::{future_reply, Waiter};
pub use waiter::{AcceptReply, GoneSignal};

/// Most waiters served by one accept round (one transaction).
pub const ROUND_MAX_WAITERS: usize = 100;

/// How often waiters are checked for having gone away while nothing else
/// happens (so that a dispatcher whose acceptors all left stops watching),
/// while any waiter's reply cannot say so itself
/// ([`AcceptReply::signal_gone`]). With only replies that can, an idle
/// dispatcher has no timer but its waiters' deadlines.
const PRUNE_INTERVAL: Duration = Duration::from_secs(1);

/// One job type's dispatcher on this node: started by the registry, run
/// by `task`, its rounds in `round`, its queue handed over on a panic by
/// `hand_over`.
struct Dispatcher {
    shared: Arc<Context>,
    /// The node's dispatchers, this one among them.
    registry: Arc<Dispatchers>,
    job_type: Vec<u8>,
    id: u64,
    receiver: mpsc::UnboundedReceiver<Waiter>,
    cancel: CancellationToken,
    waiters: VecDeque<Waiter>,
    /// The earliest `run_at` of the type's scheduled jobs, as the last
    /// round saw it: the timer.
    next_due: Option<u64>,
    /// The type was paused at the last round.
    paused: bool,
    /// Rung by the replies of waiters that stop waiting.
    gone: Arc<Notify>,
    /// Where a run that panics leaves its queue for the next one.
    home: Arc<Mutex<Option<Parked>>>,
    /// The waiters of the round in flight, and the tokens it takes jobs
    /// under: a panic gives the jobs back and the waiters their place.
    in_round: Vec<Waiter>,
    round_tokens: Vec<(Vec<u8>, AcceptToken)>,
    /// Its run returned (rather than being dropped mid-way by a panic).
    ended: bool,
}
