//! [`SimTransaction`]: one transaction on a simulated cluster, with
//! FoundationDB's client-side behaviour: a read version taken at the first
//! read (or at commit), read-your-writes, read conflict ranges for every
//! non-snapshot read (for a limited range read, only the part it returned)
//! and for every watch (creating one reads its key), write errors deferred
//! to the next read or the commit, and watches armed at commit.

use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use tokio::sync::oneshot;

use super::cluster::{CommitRequest, WatchRequest};
use super::conflicts::{key_after, RangeSet};
use super::watch::{too_many_watches, transaction_cancelled, WatchSender};
use super::writes::Writes;
use super::Handle;
use crate::store::{CommitInfo, KeyValue, RangeRequest, StoreError, Transaction, Watch, MAX_TRANSACTION_SIZE};

#[derive(Default)]
struct State {
    read_version: Option<u64>,
    writes: Writes,
    reads: RangeSet,
    /// The first failed write, reported by the next read or the commit.
    deferred: Option<StoreError>,
    watches: Vec<(Vec<u8>, WatchSender)>,
    /// Committed, or failed for good: the transaction takes no more work.
    done: bool,
    /// A read was refused with `accessed_unreadable`: as on FoundationDB,
    /// the commit then fails with the same error (other reads still work).
    read_unreadable: bool,
}

pub struct SimTransaction {
    handle: Arc<Handle>,
    state: Mutex<State>,
}

impl SimTransaction {
    pub(super) fn new(handle: Arc<Handle>) -> Self {
        SimTransaction { handle, state: Mutex::new(State::default()) }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.handle.is_closed() {
            return Err(StoreError::Closed);
        }
        let st = self.lock();
        if let Some(err) = &st.deferred {
            return Err(err.clone());
        }
        if st.done {
            return Err(StoreError::Invalid("transaction already committed".into()));
        }
        Ok(())
    }

    /// The transaction's read version, taken on first use.
    async fn version(&self) -> Result<u64, StoreError> {
        if let Some(v) = self.lock().read_version {
            return Ok(v);
        }
        let v = self.handle.cluster.read_version().await;
        // Two reads racing for the first version keep the first one taken.
        Ok(*self.lock().read_version.get_or_insert(v))
    }

    /// Applies a write now; a failure is kept for the next read or commit.
    fn write(&self, f: impl FnOnce(&mut Writes, Option<u64>) -> Result<(), StoreError>) {
        let mut st = self.lock();
        if st.deferred.is_some() || st.done {
            return;
        }
        let read_version = st.read_version;
        if let Err(e) = f(&mut st.writes, read_version) {
            st.deferred = Some(e);
        }
    }
}

#[async_trait]
impl Transaction for SimTransaction {
    async fn get(&self, key: &[u8], snapshot: bool) -> Result<Option<Vec<u8>>, StoreError> {
        self.check()?;
        let rv = self.version().await?;
        let stored = self.handle.cluster.get(key, rv).await?;
        let mut st = self.lock();
        let value = st.writes.read(key, stored).inspect_err(|e| st.read_unreadable |= e.is_accessed_unreadable())?;
        if !snapshot && st.writes.read_depends_on_store(key) {
            st.reads.add_key(key);
        }
        Ok(value)
    }

    async fn get_range(&self, range: &RangeRequest) -> Result<Vec<KeyValue>, StoreError> {
        self.check()?;
        let rv = self.version().await?;
        let (begin, end) = (range.begin.as_slice(), range.end.as_slice());
        let merged = self.lock().writes.touches(begin, end);
        let out = if merged {
            let stored = self.handle.cluster.range(begin, end, rv, 0, false).await?;
            let mut st = self.lock();
            st.writes
                .read_range(stored, begin, end, range.limit, range.reverse)
                .inspect_err(|e| st.read_unreadable |= e.is_accessed_unreadable())?
        } else {
            self.handle.cluster.range(begin, end, rv, range.limit, range.reverse).await?
        };
        if !range.snapshot && begin < end {
            // A read that stopped at its limit conflicts only with writes
            // in the part it covered (FDB's read conflict range).
            let full = range.limit == 0 || out.len() < range.limit;
            let (b, e) = match out.last() {
                Some((last, _)) if !full && !range.reverse => (begin.to_vec(), key_after(last)),
                Some((last, _)) if !full => (last.clone(), end.to_vec()),
                _ => (begin.to_vec(), end.to_vec()),
            };
            self.lock().reads.add(&b, &e);
        }
        Ok(out)
    }

    async fn read_version(&self) -> Result<u64, StoreError> {
        self.check()?;
        self.version().await
    }

    fn set(&self, key: &[u8], value: &[u8]) {
        self.write(|w, _| w.set(key, value));
    }

    fn clear(&self, key: &[u8]) {
        self.write(|w, _| {
            w.clear(key);
            Ok(())
        });
    }

    fn clear_range(&self, begin: &[u8], end: &[u8]) {
        self.write(|w, _| {
            w.clear_range(begin, end);
            Ok(())
        });
    }

    fn atomic_add(&self, key: &[u8], delta: i64) {
        self.write(|w, _| w.add(key, delta));
    }

    fn atomic_byte_max(&self, key: &[u8], value: &[u8]) {
        self.write(|w, _| w.byte_max(key, value));
    }

    fn set_versionstamped_key(&self, key: &[u8], value: &[u8]) {
        self.write(|w, rv| w.set_versionstamped_key(key, value, rv));
    }

    fn set_versionstamped_value(&self, key: &[u8], value: &[u8]) {
        self.write(|w, _| w.set_versionstamped_value(key, value));
    }

    fn add_read_conflict_key(&self, key: &[u8]) {
        self.lock().reads.add_key(key);
    }

    fn watch(&self, key: &[u8]) -> Watch {
        let Some(slot) = self.handle.watch_count.acquire() else {
            return Box::pin(async { Err(too_many_watches()) });
        };
        let (tx, rx) = oneshot::channel();
        let mut st = self.lock();
        // Creating a watch reads the key, without `snapshot`
        // (`RYWImpl::watch`: `readWithConflictRange(.., Snapshot::False)`):
        // a writing transaction that watches a key conflicts with every
        // commit of that key since its read version.
        if st.writes.read_depends_on_store(key) {
            st.reads.add_key(key);
        }
        st.watches.push((key.to_vec(), tx));
        drop(st);
        Box::pin(async move {
            let _slot = slot;
            rx.await.unwrap_or_else(|_| Err(transaction_cancelled()))
        })
    }

    async fn commit(&self) -> Result<CommitInfo, StoreError> {
        let result = self.commit_inner().await;
        let mut st = self.lock();
        st.done = true;
        if result.is_err() {
            // Their transaction failed: the watches resolve with its error.
            let err = result.clone().err();
            for (_, tx) in st.watches.drain(..) {
                let _ = tx.send(Err(err.clone().unwrap_or_else(transaction_cancelled)));
            }
        }
        result
    }

    async fn on_error(&self, err: StoreError) -> Result<(), StoreError> {
        {
            let mut st = self.lock();
            st.done = true;
            st.watches.clear();
        }
        if !err.is_retryable() {
            return Err(err);
        }
        tokio::time::sleep(self.handle.cluster.backoff()).await;
        Ok(())
    }
}

impl SimTransaction {
    async fn commit_inner(&self) -> Result<CommitInfo, StoreError> {
        self.check()?;
        if self.lock().read_unreadable {
            return Err(StoreError::accessed_unreadable());
        }
        let rv = self.version().await?;
        let read_only = self.lock().writes.is_empty();
        let info = if read_only {
            CommitInfo { version: None, versionstamp: None }
        } else {
            let (request, reply) = {
                let st = self.lock();
                if st.writes.size(&st.reads) > MAX_TRANSACTION_SIZE {
                    return Err(StoreError::TransactionTooLarge);
                }
                let (reply, rx) = oneshot::channel();
                let request = CommitRequest {
                    read_version: rv,
                    reads: st.reads.clone(),
                    writes: st.writes.conflicts().clone(),
                    mutations: st.writes.mutations().to_vec(),
                    reply,
                };
                (request, rx)
            };
            self.handle.cluster.submit(request);
            let (version, stamp) = reply.await.map_err(|_| StoreError::CommitUnknown)??;
            let stamped = self.lock().writes.mutations().iter().any(|m| m.is_versionstamped());
            CommitInfo { version: Some(version), versionstamp: stamped.then_some(stamp) }
        };
        self.arm_watches(rv, info.version);
        Ok(info)
    }

    /// Arms the transaction's watches with the values it saw: its own
    /// writes over the values at its read version.
    fn arm_watches(&self, read_version: u64, commit_version: Option<u64>) {
        let mut st = self.lock();
        let pending = std::mem::take(&mut st.watches);
        let requests = pending
            .into_iter()
            .map(|(key, tx)| {
                let stored = self.handle.cluster.value_at(&key, read_version);
                let expected = match st.writes.read(&key, stored) {
                    Ok(v) => v,
                    // A versionstamped value: what the commit wrote.
                    Err(_) => self.handle.cluster.value_at(&key, commit_version.unwrap_or(read_version)),
                };
                WatchRequest { handle: self.handle.id, key, expected, tx }
            })
            .collect();
        drop(st);
        self.handle.cluster.arm_watches(requests);
    }
}
