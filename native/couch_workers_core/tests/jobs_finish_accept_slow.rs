//! `finish_accept` answers within what its caller waits, also when the
//! store is slow in every transaction: a finish that committed must never
//! reach the caller as `{error, timeout}`.
//!
//! `couch_workers_jobs:finish_accept/3` waits twice the API's call
//! timeout (`couch_workers_app:call_timeout/0`: the transaction budget
//! plus 5 s) for the answer, then abandons the call and answers
//! `{error, timeout}`, whatever the Rust side did. The finish commits in
//! the first transaction; when that one's accept round takes nothing but
//! says more may be taken (stale pending keys cleared, scheduled jobs
//! due), a follow-up accept runs. Each transaction may take up to the
//! budget; before the fix the follow-up was `job_accept` with timeout 0's
//! loop, up to 8 rounds and a promotion per round, so a slow store could
//! keep the answer of a committed finish past the caller's wait.
//!
//! Here every commit takes 4 s (the budget is 5 s), and the queue's head
//! is stale pending keys (their records gone), each costing one round.
//! The clock is tokio's, paused: the run takes no real time.

mod jobs_common;

use std::sync::Arc;
use std::time::Duration;

use couch_workers_core::jobs::{JobState, NextFor};
use couch_workers_core::log::Discard;
use couch_workers_core::store::sim::{Latency, SimFaults, SimOptions, SimStore};
use couch_workers_core::store::{run, Db, TxOptions};
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Node, Settings};
use jobs_common::*;

const T: &[u8] = b"t";
const W: &[u8] = b"w";
const BUDGET: Duration = Duration::from_secs(5);
/// What the Erlang caller waits: 2 x (budget + 5 s).
const CALLER_WAIT: Duration = Duration::from_secs(2 * (5 + 5));
/// Stale pending keys ahead of the real job: more than the old loop's rounds.
const STALE: usize = 12;

#[tokio::test(start_paused = true)]
async fn a_committed_finish_is_answered_within_the_callers_wait_on_a_slow_store() {
    let sim = SimStore::new(SimOptions::new(7));
    let db: Db = sim.clone();
    let settings = Settings { tx_timeout: BUDGET, reaper_max_interval: Duration::from_secs(60), ..Settings::default() };
    let node = Node::with_db(db.clone(), settings, Arc::new(Discard));
    let spec = WorkerSpec { worker_type: T.to_vec(), id: W.to_vec(), options_json: b"{}".to_vec(), timeout_s: 3600 };
    let reg = node.register_worker(spec).await.expect("register");
    add(node.jobs(), T, b"j1", 0).await;
    add(node.jobs(), T, b"j2", 0).await;
    let running = accept_now(node.jobs(), T, W).await;
    assert_eq!(running.job.id, b"j1");

    // Stale pending keys at the head of the queue (priority -1 runs first).
    let ks = ks(&node).clone();
    let ks = &ks;
    run(db.as_ref(), TxOptions::write(), |tx| async move {
        for i in 0..STALE {
            tx.set(&ks.pending(T, -1, &[0; 12], format!("gone{i:02}").as_bytes()), b"");
        }
        tx.atomic_add(&ks.pending_count(T), STALE as i64);
        Ok(())
    })
    .await
    .expect("stale keys");

    // Every commit now takes 4 s; the proxy goes idle first, so that the
    // latency applies from the next commit on.
    sim.set_faults(SimFaults { commit_latency: Latency::fixed(Duration::from_secs(4)), ..SimFaults::none() });
    tokio::time::sleep(Duration::from_millis(100)).await;

    let next = NextFor { worker_type: T, worker: W, incarnation: Some(*reg.incarnation()) };
    let started = tokio::time::Instant::now();
    let answer = node.jobs().finish_accept(&running.fence(), b"{}", next).await;
    let took = started.elapsed();

    assert_eq!(get(node.jobs(), T, b"j1").await.state, JobState::Finished, "the finish committed");
    assert!(answer.is_ok(), "a committed finish answers ok: {answer:?}");
    assert!(
        took <= CALLER_WAIT,
        "the committed finish was answered after {took:?}: its caller gave up at {CALLER_WAIT:?} and answered timeout"
    );
    node.stop().await;
}
