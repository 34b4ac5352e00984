//! `finish_accept`: a worker's finish and its next accept in one
//! transaction. The finish is `finish`'s (same errors, nothing taken on an
//! error); the accept is `accept` with timeout 0's (queue order, pause,
//! the registration's incarnation); a commit answered
//! `commit_unknown_result` after it landed answers with the job that
//! commit took, never a second one.

mod jobs_common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use couch_workers_core::jobs::{JobState, NextFor};
use couch_workers_core::log::Discard;
use couch_workers_core::store::sim::{CommitFault, SimOptions, SimStore};
use couch_workers_core::store::Db;
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Error, Node, Registration, Settings};
use jobs_common::*;

const T: &[u8] = b"t";

fn next_for(worker: &[u8]) -> NextFor<'_> {
    NextFor { worker_type: T, worker, incarnation: None }
}

/// A node with worker `w` of `T` registered, then `ids` added (pending in
/// that order). The cluster holds the store's directory: keep it.
async fn node_with_jobs(store: StoreKind, ids: &[&[u8]]) -> (Cluster, Arc<Node>, Registration) {
    let c = Cluster::on(store);
    let node = c.node();
    let w = register(&node, T, b"w").await;
    for id in ids {
        add(node.jobs(), T, id, 0).await;
    }
    (c, node, w)
}

async fn finish_accept_finishes_and_takes_the_next_job_in_queue_order(store: StoreKind) {
    let (_c, node, _w) = node_with_jobs(store, &[b"a", b"b", b"c"]).await;
    let jobs = node.jobs();
    let first = accept_now(jobs, T, b"w").await;
    assert_eq!(first.job.id, b"a");
    let second = jobs
        .finish_accept(&fence(&first), b"{\"r\":1}", next_for(b"w"))
        .await
        .expect("finish_accept")
        .expect("a next job");
    assert_eq!(second.job.id, b"b", "FIFO");
    assert_eq!(second.job.state, JobState::Running);
    assert_eq!(second.job.worker.as_deref(), Some(&b"w"[..]));
    assert_eq!(get(jobs, T, b"b").await, second.job, "the handle's job is the stored one (its VS complete)");
    let a = get(jobs, T, b"a").await;
    assert_eq!(a.state, JobState::Finished);
    assert_eq!(a.result.as_deref(), Some(&b"{\"r\":1}"[..]));
    let third = jobs.finish_accept(&fence(&second), b"{}", next_for(b"w")).await.unwrap().expect("c");
    assert_eq!(third.job.id, b"c");
    // The queue is empty: the finish commits, nothing is taken.
    assert_eq!(jobs.finish_accept(&fence(&third), b"{}", next_for(b"w")).await, Ok(None));
    assert_eq!(get(jobs, T, b"c").await.state, JobState::Finished);
    let counts = jobs.counts(T).await.unwrap();
    assert!(counts.contains(&(JobState::Finished, 3)) && counts.contains(&(JobState::Running, 0)), "{counts:?}");
    assert_eq!(active_keys(&node, T, b"w").await, 0);
    node.stop().await;
}

async fn a_refused_finish_writes_nothing_and_takes_nothing(store: StoreKind) {
    let (_c, node, _w) = node_with_jobs(store, &[b"a", b"b"]).await;
    let jobs = node.jobs();
    let h = accept_now(jobs, T, b"w").await;
    jobs.finish(&fence(&h), b"{}").await.unwrap();
    // The handle no longer holds the job: not_owner, and b stays pending.
    assert_eq!(jobs.finish_accept(&fence(&h), b"{}", next_for(b"w")).await, Err(Error::NotOwner));
    assert_eq!(get(jobs, T, b"b").await.state, JobState::Pending);
    assert_eq!(jobs.pending_count(T).await, Ok(1));
    node.stop().await;
}

async fn no_next_job_while_paused_or_for_an_ended_registration(store: StoreKind) {
    let (_c, node, w) = node_with_jobs(store, &[b"a", b"b", b"c"]).await;
    let jobs = node.jobs();
    let h = accept_now(jobs, T, b"w").await;
    jobs.set_paused(T, true).await.unwrap();
    assert_eq!(jobs.finish_accept(&fence(&h), b"{}", next_for(b"w")).await, Ok(None), "paused: the finish only");
    assert_eq!(get(jobs, T, b"a").await.state, JobState::Finished);
    jobs.set_paused(T, false).await.unwrap();
    let h = accept_now(jobs, T, b"w").await;
    assert_eq!(h.job.id, b"b");
    // For an incarnation that no longer holds the id: nothing taken.
    let old = *w.incarnation();
    drop(w);
    let _w2 = register(&node, T, b"w").await;
    let next = NextFor { worker_type: T, worker: b"w", incarnation: Some(old) };
    // b was released by the unregister; take it again under the new one.
    let h = accept_now(jobs, T, b"w").await;
    assert_eq!(jobs.finish_accept(&fence(&h), b"{}", next).await, Ok(None));
    assert_eq!(get(jobs, T, &h.job.id).await.state, JobState::Finished);
    assert_eq!(jobs.pending_count(T).await, Ok(1), "the last job stays pending");
    node.stop().await;
}

async fn workers_draining_with_finish_accept_take_every_job_once(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs().clone();
    let n = 400usize;
    let all: Vec<_> = (0..n)
        .map(|i| couch_workers_core::jobs::NewJob {
            id: format!("j{i:04}").into_bytes(),
            info: b"{}".to_vec(),
            priority: 0,
        })
        .collect();
    jobs.add_many(T, &all).await.unwrap();
    let mut regs = Vec::new();
    let mut tasks = Vec::new();
    for w in 0..6 {
        let id = format!("w{w}").into_bytes();
        regs.push(register(&node, T, &id).await);
        let jobs = jobs.clone();
        tasks.push(tokio::spawn(async move {
            let mut done = Vec::new();
            let mut next = jobs.accept(T, &id, Duration::ZERO).await.ok();
            while let Some(h) = next {
                done.push(h.job.id.clone());
                next = jobs.finish_accept(&fence(&h), b"{}", next_for(&id)).await.expect("finish_accept");
            }
            done
        }));
    }
    let mut seen = HashSet::new();
    for t in tasks {
        for id in t.await.unwrap() {
            assert!(seen.insert(id.clone()), "{} taken twice", String::from_utf8_lossy(&id));
        }
    }
    assert_eq!(seen.len(), n);
    let counts = jobs.counts(T).await.unwrap();
    assert!(counts.contains(&(JobState::Finished, n as u64)), "{counts:?}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_landed_unknown_commit_answers_with_the_job_it_took() {
    let sim = SimStore::new(SimOptions::new(7));
    let settings = Settings { reaper_max_interval: Duration::from_secs(3600), ..Settings::default() };
    let node = Node::with_db(sim.connect() as Db, settings, Arc::new(Discard));
    jobs_common::sim_node_settled(&sim).await;
    let spec = WorkerSpec { worker_type: T.to_vec(), id: b"w".to_vec(), options_json: b"{}".to_vec(), timeout_s: 3600 };
    let _reg = node.register_worker(spec).await.expect("register");
    let jobs = node.jobs();
    for id in [&b"a"[..], b"b", b"c"] {
        jobs.add(T, id, b"{}", 0).await.unwrap();
    }
    let h = jobs.accept(T, b"w", Duration::ZERO).await.unwrap();
    let before = sim.stats().unknown_committed;
    sim.inject_commit_fault(CommitFault::UnknownCommitted);
    let next =
        jobs.finish_accept(&fence(&h), b"{}", next_for(b"w")).await.expect("ok for its own landed commit").expect("b");
    assert_eq!(sim.stats().unknown_committed, before + 1, "the call's commit took the fault");
    assert_eq!(next.job.id, b"b", "the job the landed commit took, not c");
    assert_eq!(jobs.get(T, b"a").await.unwrap().state, JobState::Finished);
    assert_eq!(jobs.get(T, b"b").await.unwrap().state, JobState::Running);
    assert_eq!(jobs.get(T, b"c").await.unwrap().state, JobState::Pending, "nothing else taken");
    jobs.finish(&fence(&next), b"{}").await.expect("the handle holds b");
    node.stop().await;
}

/// A job resubmitted while it runs, ended with `finish_accept`: the finish
/// queues it again (its pending key and record written with versionstamps)
/// and the accept must not read those back in the same transaction
/// (`accessed_unreadable`, 1036). The finish commits, the job is queued
/// again with the new info, and the next job is taken.
async fn resubmitted_job_finishes_with_finish_accept(node: &Arc<Node>) {
    let jobs = node.jobs();
    for id in [&b"a"[..], b"b"] {
        add(jobs, T, id, 0).await;
    }
    let h = accept_now(jobs, T, b"w").await;
    assert_eq!(h.job.id, b"a");
    jobs.resubmit(T, b"a", b"{\"again\":1}", &Default::default(), None).await.expect("resubmit while running");
    let next = jobs.finish_accept(&fence(&h), b"{}", next_for(b"w")).await.expect("finish_accept of a resubmitted job");
    let a = get(jobs, T, b"a").await;
    assert_eq!(a.state, JobState::Pending, "queued again by its resubmission: {a:?}");
    assert_eq!(a.info, b"{\"again\":1}");
    let next = next.expect("the next job");
    assert_eq!(next.job.id, b"b", "b was first in the queue");
    assert_eq!(get(jobs, T, b"b").await, next.job);
    // The resubmitted run is taken next, and finishes as any other.
    let again = jobs.finish_accept(&fence(&next), b"{}", next_for(b"w")).await.unwrap().expect("a again");
    assert_eq!(again.job.id, b"a");
    assert_eq!(jobs.finish_accept(&fence(&again), b"{}", next_for(b"w")).await, Ok(None));
    assert_eq!(get(jobs, T, b"a").await.state, JobState::Finished);
    assert_eq!(jobs.pending_count(T).await, Ok(0));
}

async fn a_resubmitted_job_finishes_with_finish_accept(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let _w = register(&node, T, b"w").await;
    resubmitted_job_finishes_with_finish_accept(&node).await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resubmitted_job_finishes_with_finish_accept_sim() {
    let sim = SimStore::new(SimOptions::new(11));
    let node = Node::with_db(sim.connect() as Db, Settings::default(), Arc::new(Discard));
    let _w = register(&node, T, b"w").await;
    resubmitted_job_finishes_with_finish_accept(&node).await;
    node.stop().await;
}

couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread"),
    stores: [embedded: Embedded],
    tests: [
        finish_accept_finishes_and_takes_the_next_job_in_queue_order,
        a_refused_finish_writes_nothing_and_takes_nothing,
        no_next_job_while_paused_or_for_an_ended_registration,
        workers_draining_with_finish_accept_take_every_job_once,
        a_resubmitted_job_finishes_with_finish_accept,
    ],
);
