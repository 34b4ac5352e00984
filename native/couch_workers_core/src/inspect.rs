//! Operations' read side: what an operator asks of the cluster, read from
//! the store (no subscription, no node-local cache): the worker types that
//! have live workers, each worker of a type with its options, timeout,
//! heartbeat age and running-job count, and whether a job type is paused.
//! (Jobs, their types and counts are the job API's reads: `jobs::ops`.)
//!
//! Every read is a snapshot read in a read-only transaction (it adds no
//! conflicts to the nodes' writes) and every range is read in pages of
//! [`PAGE`] keys, so no single read grows with the cluster. The cost of
//! [`workers`] is in proportion to the type's workers plus its running
//! jobs; [`worker_types`] costs two one-key reads per type, whatever the
//! number of workers (figures: `bench/RESULTS.md`).

use crate::keyspace::Keyspace;
use crate::store::{KeyValue, RangeRequest, StoreError, Tx};

/// Keys per range read.
pub const PAGE: usize = 1000;

/// One worker as [`workers`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerInfo {
    pub id: Vec<u8>,
    /// The options, a JSON object, as registered.
    pub options_json: Vec<u8>,
    /// The health timeout in seconds; `None` when the health record is
    /// missing or unreadable (a registration half seen, or a record of an
    /// unknown shape that a reaper will remove).
    pub timeout_s: Option<i64>,
    /// Store versions since the last heartbeat's commit ÷ 1,000 (versions
    /// advance about a million per second, so about milliseconds; it jumps
    /// with the store's versions). `None` with `timeout_s`.
    pub heartbeat_age_ms: Option<u64>,
    /// The worker's running jobs (its active keys).
    pub running: u64,
}

/// Every key-value pair of `[begin, end)`, read in pages of [`PAGE`].
async fn read_paged(tx: &Tx, begin: Vec<u8>, end: Vec<u8>) -> Result<Vec<KeyValue>, StoreError> {
    let mut out = Vec::new();
    let mut from = begin;
    loop {
        let page = tx.get_range(&RangeRequest::new(from, end.clone()).limit(PAGE).snapshot(true)).await?;
        let next = match page.last() {
            // The first key after the last one read.
            Some((last, _)) if page.len() == PAGE => [last.as_slice(), &[0x00]].concat(),
            _ => {
                out.extend(page);
                return Ok(out);
            }
        };
        out.extend(page);
        from = next;
    }
}

/// The worker types that have at least one registered worker now, in
/// byte order. Skips from type to type: one read finds the next type's
/// first key, one more tells whether it has a member, so the cost is in
/// proportion to the types (live or emptied), not to their workers.
pub async fn worker_types(tx: &Tx, ks: &Keyspace) -> Result<Vec<Vec<u8>>, StoreError> {
    let (mut from, end) = ks.all_workers_range();
    let mut types = Vec::new();
    loop {
        let first = tx.get_range(&RangeRequest::new(from.clone(), end.clone()).limit(1).snapshot(true)).await?;
        let Some((key, _)) = first.into_iter().next() else { return Ok(types) };
        let Some(worker_type) = ks.worker_type_of(&key) else {
            // A key of no shape of ours: step over it alone.
            from = key;
            from.push(0x00);
            continue;
        };
        let (mb, me) = ks.members_range(&worker_type);
        if !tx.get_range(&RangeRequest::new(mb, me).limit(1).snapshot(true)).await?.is_empty() {
            types.push(worker_type.clone());
        }
        from = ks.worker_type_range(&worker_type).1;
    }
}

/// Every registered worker of `worker_type`, in id order. Reads the
/// type's member, health and active ranges (paged) and the transaction's
/// read version, against which heartbeat ages are measured.
pub async fn workers(tx: &Tx, ks: &Keyspace, worker_type: &[u8]) -> Result<Vec<WorkerInfo>, StoreError> {
    let now = tx.read_version().await?;
    let (mb, me) = ks.members_range(worker_type);
    let members = read_paged(tx, mb, me).await?;
    let (hb, he) = ks.health_range(worker_type);
    let mut health = std::collections::HashMap::with_capacity(members.len());
    for (key, value) in read_paged(tx, hb, he).await? {
        if let Some(crate::keyspace::WorkerKey::Health { worker, .. }) = ks.parse_worker_key(&key) {
            if let Some(h) = Keyspace::parse_health(&value) {
                health.insert(worker, h);
            }
        }
    }
    let (ab, ae) = ks.active_type_range(worker_type);
    let mut running: std::collections::HashMap<Vec<u8>, u64> = std::collections::HashMap::new();
    for (key, _) in read_paged(tx, ab, ae).await? {
        if let Some((worker, _job)) = ks.parse_active(worker_type, &key) {
            *running.entry(worker).or_default() += 1;
        }
    }
    let mut out = Vec::with_capacity(members.len());
    for (key, options_json) in members {
        let Some(crate::keyspace::WorkerKey::Member { worker, .. }) = ks.parse_worker_key(&key) else { continue };
        let h = health.get(&worker);
        out.push(WorkerInfo {
            timeout_s: h.map(|h| h.timeout_s),
            heartbeat_age_ms: h.map(|h| now.saturating_sub(h.version()) / 1000),
            running: running.get(&worker).copied().unwrap_or(0),
            id: worker,
            options_json,
        });
    }
    Ok(out)
}

/// Whether `job_type` is paused (`couch_workers:job_pause/1`): one
/// snapshot read of the flag every accept round reads. The job API writes
/// the flag and reads it only inside accept rounds; the status page and the
/// command line need it on its own.
pub async fn job_paused(tx: &Tx, ks: &Keyspace, job_type: &[u8]) -> Result<bool, StoreError> {
    Ok(tx.get(&ks.paused(job_type), true).await?.is_some())
}

impl crate::context::Context {
    /// [`worker_types`] in a read-only transaction of this node's store.
    pub async fn worker_types(&self) -> Result<Vec<Vec<u8>>, crate::Error> {
        let ks = &self.ks;
        Ok(crate::store::run(self.db.as_ref(), self.read, |tx| async move { worker_types(&tx, ks).await }).await?)
    }

    /// [`workers`] of `worker_type` in a read-only transaction of this
    /// context's store; `key_too_large` for a type no key can hold.
    pub async fn workers(&self, worker_type: &[u8]) -> Result<Vec<WorkerInfo>, crate::Error> {
        let ks = &self.ks;
        crate::error::check_key(&ks.member(worker_type, b""))?;
        Ok(crate::store::run(self.db.as_ref(), self.read, |tx| async move { workers(&tx, ks, worker_type).await })
            .await?)
    }

    /// [`job_paused`] in a read-only transaction of this node's store;
    /// `key_too_large` for a type no key can hold.
    pub async fn job_paused(&self, job_type: &[u8]) -> Result<bool, crate::Error> {
        let ks = &self.ks;
        crate::error::check_key(&ks.paused(job_type))?;
        Ok(crate::store::run(self.db.as_ref(), self.read, |tx| async move { job_paused(&tx, ks, job_type).await })
            .await?)
    }
}
