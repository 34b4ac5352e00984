//! What the key-space behaviours share: the type and timestamps they use,
//! one-line worker operations, raw reads and writes.

use std::sync::Arc;
use std::time::Duration;

use crate::jobs::{JobHandle, JobService};
use crate::keyspace::{Health, Incarnation, Keyspace};
use crate::roster;
use crate::store::{run, run_attempts, CommitInfo, Db, KeyValue, RangeRequest, TxOptions, Versionstamp};
use crate::workers::{self, Heartbeat, Membership, WorkerSpec};
use crate::{Node, Settings};

/// The job and worker type most tests use.
pub(super) const T: &[u8] = b"replicator";

/// The informational wall clock of the health records written here.
pub(super) const TSTAMP: i64 = 1_700_000_000;

/// The incarnation the helpers register, beat and remove as, unless a test
/// names another (`*_as`).
pub(super) const INC: Incarnation = [7; 16];

pub(super) fn ks_of(db: &Db) -> Keyspace {
    Keyspace::new(&db.prefix())
}

pub(super) fn spec(worker_type: &[u8], id: &[u8], options: &[u8], timeout_s: u64) -> WorkerSpec {
    WorkerSpec { worker_type: worker_type.to_vec(), id: id.to_vec(), options_json: options.to_vec(), timeout_s }
}

pub(super) fn info(n: usize) -> Vec<u8> {
    format!("{{\"n\":{n}}}").into_bytes()
}

pub(super) fn stamp_of(info: &CommitInfo) -> Versionstamp {
    info.versionstamp.expect("the commit wrote a versionstamp")
}

/// Registers `spec` in a transaction of its own; the commit's versionstamp.
pub(super) async fn register(db: &Db, spec: &WorkerSpec) -> Versionstamp {
    register_as(db, spec, &INC).await
}

pub(super) async fn register_as(db: &Db, spec: &WorkerSpec, inc: &Incarnation) -> Versionstamp {
    let ks = &ks_of(db);
    let ((), info) =
        run_attempts(
            &**db,
            TxOptions::write(),
            |tx, _| async move { roster::register(&tx, ks, spec, inc, TSTAMP).await },
        )
        .await
        .expect("register commits");
    stamp_of(&info)
}

pub(super) async fn heartbeat(db: &Db, spec: &WorkerSpec, tstamp: i64) -> (Heartbeat, CommitInfo) {
    heartbeat_as(db, spec, &INC, tstamp).await
}

pub(super) async fn heartbeat_as(
    db: &Db,
    spec: &WorkerSpec,
    inc: &Incarnation,
    tstamp: i64,
) -> (Heartbeat, CommitInfo) {
    let ks = &ks_of(db);
    run_attempts(&**db, TxOptions::write(), |tx, _| async move { roster::heartbeat(&tx, ks, spec, inc, tstamp).await })
        .await
        .expect("heartbeat commits")
}

pub(super) async fn remove(db: &Db, worker_type: &[u8], id: &[u8]) -> (bool, CommitInfo) {
    remove_as(db, worker_type, id, &INC).await
}

pub(super) async fn remove_as(db: &Db, worker_type: &[u8], id: &[u8], inc: &Incarnation) -> (bool, CommitInfo) {
    let ks = &ks_of(db);
    run_attempts(&**db, TxOptions::write(), |tx, _| async move { roster::remove(&tx, ks, worker_type, id, inc).await })
        .await
        .expect("remove commits")
}

/// Reaps `id` if its health record is still `observed`.
pub(super) async fn reap(db: &Db, worker_type: &[u8], id: &[u8], observed: &[u8]) -> (bool, CommitInfo) {
    let ks = &ks_of(db);
    run_attempts(
        &**db,
        TxOptions::write(),
        |tx, _| async move { roster::reap(&tx, ks, worker_type, id, observed).await },
    )
    .await
    .expect("reap commits")
}

pub(super) async fn membership(db: &Db, worker_type: &[u8]) -> Membership {
    let ks = &ks_of(db);
    run(&**db, TxOptions::read(), |tx| async move { workers::read_membership(&tx, ks, worker_type).await })
        .await
        .expect("read membership")
}

pub(super) async fn health(db: &Db, worker_type: &[u8], id: &[u8]) -> Option<Health> {
    let ks = &ks_of(db);
    run(&**db, TxOptions::read(), |tx| async move { workers::read_health(&tx, ks, worker_type, id).await })
        .await
        .expect("read health")
}

pub(super) async fn raw_get(db: &Db, key: &[u8]) -> Option<Vec<u8>> {
    run(&**db, TxOptions::read(), |tx| async move { tx.get(key, false).await }).await.expect("read")
}

pub(super) async fn raw_set(db: &Db, key: &[u8], value: &[u8]) {
    run(&**db, TxOptions::write(), |tx| async move {
        tx.set(key, value);
        Ok(())
    })
    .await
    .expect("write")
}

pub(super) async fn range(db: &Db, (begin, end): (Vec<u8>, Vec<u8>)) -> Vec<KeyValue> {
    let r = &RangeRequest::new(begin, end);
    run(&**db, TxOptions::read(), |tx| async move { tx.get_range(r).await }).await.expect("range read")
}

pub(super) fn node(db: &Db) -> Arc<Node> {
    Node::with_db(db.clone(), Settings::default(), Arc::new(crate::log::Discard))
}

pub(super) async fn accept_now(jobs: &JobService, worker: &[u8]) -> JobHandle {
    jobs.accept(T, worker, Duration::ZERO).await.expect("a job to accept")
}

pub(super) async fn count(jobs: &JobService) -> u64 {
    jobs.pending_count(T).await.expect("pending count")
}

pub(super) fn sorted(mut v: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<(Vec<u8>, Vec<u8>)> {
    v.sort();
    v
}
