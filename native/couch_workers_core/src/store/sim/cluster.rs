//! The simulated cluster that every handle of one sim store shares: its
//! data, version clock, conflict history, armed watches, the commit
//! proxy's batches and the seeded dice. One mutex, never held across an
//! `.await`.
//!
//! A commit goes to the proxy's queue; the proxy waits one commit latency,
//! then resolves everything that queued meanwhile as one batch: one commit
//! version, each transaction its own batch order (the last two bytes of
//! its versionstamp), each checked against every commit since its read
//! version, the earlier transactions of its own batch included.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::conflicts::{ConflictHistory, RangeSet};
use super::data::VersionedData;
use super::faults::{CommitFault, Dice, SimFaults};
use super::versions::VersionClock;
use super::watch::{lost_in_recovery, WatchRegistry, WatchSender};
use super::writes::{Applied, Mutation};
use super::SimStats;
use crate::store::mutation::{add_le_i64, byte_max};
use crate::store::{KeyValue, StoreError, Versionstamp, MAX_READ_TRANSACTION_LIFE_VERSIONS, VERSIONSTAMP_LEN};

/// What a transaction sends to the proxy.
pub(super) struct CommitRequest {
    pub(super) read_version: u64,
    pub(super) reads: RangeSet,
    pub(super) writes: RangeSet,
    pub(super) mutations: Vec<Mutation>,
    pub(super) reply: oneshot::Sender<Result<(u64, Versionstamp), StoreError>>,
}

/// A watch to arm once its transaction committed.
pub(super) struct WatchRequest {
    pub(super) handle: u64,
    pub(super) key: Vec<u8>,
    pub(super) expected: Option<Vec<u8>>,
    pub(super) tx: WatchSender,
}

struct State {
    data: VersionedData,
    clock: VersionClock,
    history: ConflictHistory,
    watches: WatchRegistry,
    dice: Dice,
    queue: Vec<CommitRequest>,
    proxy_running: bool,
    stats: SimStats,
}

pub(super) struct Cluster {
    state: Mutex<State>,
}

fn too_old(read_version: u64, now_version: u64) -> bool {
    now_version.saturating_sub(read_version) > MAX_READ_TRANSACTION_LIFE_VERSIONS
}

fn stamp(version: u64, order: u16) -> Versionstamp {
    let mut s = [0u8; VERSIONSTAMP_LEN];
    s[..8].copy_from_slice(&version.to_be_bytes());
    s[8..].copy_from_slice(&order.to_be_bytes());
    s
}

impl Cluster {
    pub(super) fn new(seed: u64, faults: SimFaults, start_version: u64) -> Arc<Self> {
        Arc::new(Cluster {
            state: Mutex::new(State {
                data: VersionedData::default(),
                clock: VersionClock::new(start_version, Instant::now()),
                history: ConflictHistory::default(),
                watches: WatchRegistry::default(),
                dice: Dice::new(seed, faults),
                queue: Vec::new(),
                proxy_running: false,
                stats: SimStats::default(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere never leaves the state half-changed in a way
        // the next caller could not use: recover the guard.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn set_faults(&self, faults: SimFaults) {
        self.lock().dice.set_faults(faults);
    }

    pub(super) fn script(&self, fault: CommitFault) {
        self.lock().dice.script(fault);
    }

    pub(super) fn stats(&self) -> SimStats {
        let st = self.lock();
        SimStats { empty_batches: st.clock.empty_batches(), armed_watches: st.watches.len(), ..st.stats }
    }

    pub(super) fn backoff(&self) -> Duration {
        self.lock().dice.backoff()
    }

    /// A read version, after the GRV latency.
    pub(super) async fn read_version(&self) -> u64 {
        let latency = self.lock().dice.grv_latency();
        sleep(latency).await;
        let mut st = self.lock();
        st.stats.read_versions += 1;
        st.clock.read_version(Instant::now())
    }

    /// The last committed version now (no latency).
    pub(super) fn current_version(&self) -> u64 {
        self.lock().clock.read_version(Instant::now())
    }

    async fn read_latency(&self) {
        let latency = self.lock().dice.read_latency();
        sleep(latency).await;
    }

    fn check_readable(st: &mut State, read_version: u64) -> Result<(), StoreError> {
        if too_old(read_version, st.clock.read_version(Instant::now())) {
            st.stats.too_old += 1;
            return Err(StoreError::TooOld);
        }
        Ok(())
    }

    pub(super) async fn get(&self, key: &[u8], read_version: u64) -> Result<Option<Vec<u8>>, StoreError> {
        self.read_latency().await;
        let mut st = self.lock();
        Self::check_readable(&mut st, read_version)?;
        Ok(st.data.get(key, read_version))
    }

    pub(super) async fn range(
        &self,
        begin: &[u8],
        end: &[u8],
        read_version: u64,
        limit: usize,
        reverse: bool,
    ) -> Result<Vec<KeyValue>, StoreError> {
        self.read_latency().await;
        let mut st = self.lock();
        Self::check_readable(&mut st, read_version)?;
        Ok(st.data.range(begin, end, read_version, limit, reverse))
    }

    /// The value of `key` at `version`, whatever its age (for a watch's
    /// expected value).
    pub(super) fn value_at(&self, key: &[u8], version: u64) -> Option<Vec<u8>> {
        self.lock().data.get(key, version)
    }

    pub(super) fn arm_watches(&self, watches: Vec<WatchRequest>) {
        let mut st = self.lock();
        for w in watches {
            let current = st.data.latest(&w.key);
            st.watches.arm(w.handle, w.key, w.expected, current, w.tx);
        }
    }

    pub(super) fn fail_watches(&self, handle: u64, err: &StoreError) {
        self.lock().watches.fail(Some(handle), err);
    }

    /// Queues a commit for the proxy's next batch; starts the proxy if it
    /// is idle.
    pub(super) fn submit(self: &Arc<Self>, request: CommitRequest) {
        let mut st = self.lock();
        st.queue.push(request);
        if !st.proxy_running {
            st.proxy_running = true;
            let cluster = self.clone();
            tokio::spawn(async move { cluster.proxy().await });
        }
    }

    /// The commit proxy: one batch per commit latency while commits queue.
    async fn proxy(self: Arc<Self>) {
        let mut guard = ProxyGuard { cluster: Some(self.clone()) };
        loop {
            let latency = self.lock().dice.commit_latency();
            if latency.is_zero() {
                // Still let the commits that are ready join this batch.
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(latency).await;
            }
            let mut st = self.lock();
            let batch = std::mem::take(&mut st.queue);
            if batch.is_empty() {
                st.proxy_running = false;
                drop(st);
                // No await from here on: a later submit may already run
                // a new proxy, which the guard must leave alone.
                guard.cluster = None;
                return;
            }
            Self::resolve(&mut st, batch);
        }
    }

    /// A recovery: every queued commit is lost (`commit_unknown_result`),
    /// every armed watch errors, versions jump by 100 s' worth; transactions
    /// reading at an older version fail with `transaction_too_old`.
    pub(super) fn recover(&self) {
        let mut st = self.lock();
        let queued = std::mem::take(&mut st.queue);
        Self::recover_locked(&mut st, queued);
    }

    fn recover_locked(st: &mut State, lost: Vec<CommitRequest>) {
        st.stats.recoveries += 1;
        st.clock.recover(Instant::now());
        for request in lost {
            st.stats.unknown_not_committed += 1;
            let _ = request.reply.send(Err(StoreError::CommitUnknown));
        }
        st.watches.fail(None, &lost_in_recovery());
    }

    fn resolve(st: &mut State, batch: Vec<CommitRequest>) {
        if st.dice.recovery() {
            Self::recover_locked(st, batch);
            return;
        }
        st.stats.batches += 1;
        let version = st.clock.next_commit_version(Instant::now());
        let horizon = version.saturating_sub(MAX_READ_TRANSACTION_LIFE_VERSIONS);
        for (order, request) in batch.into_iter().enumerate() {
            let order = u16::try_from(order).unwrap_or(u16::MAX);
            let result = Self::resolve_one(st, &request, version, order, horizon);
            let _ = request.reply.send(result);
        }
        if let Some(n) = st.dice.spurious_watch(st.watches.len()) {
            st.stats.spurious_watch_fires += 1;
            st.watches.fire_spuriously(n);
        }
    }

    fn resolve_one(
        st: &mut State,
        request: &CommitRequest,
        version: u64,
        order: u16,
        horizon: u64,
    ) -> Result<(u64, Versionstamp), StoreError> {
        if too_old(request.read_version, version) {
            st.stats.too_old += 1;
            return Err(StoreError::TooOld);
        }
        if st.history.conflicts(request.read_version, &request.reads) {
            st.stats.conflicts += 1;
            return Err(StoreError::Conflict);
        }
        let fault = st.dice.commit_fault();
        if fault == Some(CommitFault::UnknownNotCommitted) {
            st.stats.unknown_not_committed += 1;
            return Err(StoreError::CommitUnknown);
        }
        let stamp = stamp(version, order);
        for m in &request.mutations {
            Self::apply(st, m.stamped(&stamp), version);
        }
        st.history.record(version, request.writes.clone(), horizon);
        st.stats.commits += 1;
        if fault == Some(CommitFault::UnknownCommitted) {
            st.stats.unknown_committed += 1;
            return Err(StoreError::CommitUnknown);
        }
        Ok((version, stamp))
    }

    fn apply(st: &mut State, m: Applied, version: u64) {
        let changes: Vec<(Vec<u8>, Option<Vec<u8>>)> = match m {
            Applied::Set(k, v) => vec![(k, Some(v))],
            Applied::Clear(k) => vec![(k, None)],
            Applied::ClearRange(b, e) => {
                let mut keys = st.data.live_keys(&b, &e);
                // Watches on missing keys in the range see a clear too.
                keys.extend(st.watches.keys_in(&b, &e));
                keys.sort();
                keys.dedup();
                keys.into_iter().map(|k| (k, None)).collect()
            }
            Applied::Add(k, d) => {
                let sum = add_le_i64(st.data.latest(&k).as_deref(), d).to_vec();
                vec![(k, Some(sum))]
            }
            Applied::ByteMax(k, v) => {
                let max = byte_max(st.data.latest(&k).as_deref(), &v);
                vec![(k, Some(max))]
            }
        };
        for (k, v) in changes {
            st.data.write(&k, v.clone(), version);
            st.watches.changed(&k, &v);
        }
    }
}

/// Ends a proxy that its runtime dropped mid-batch (a test's runtime
/// shutting down): the next commit starts a new proxy, and the commits it
/// had queued answer `commit_unknown_result` (they did not commit) rather
/// than wait forever.
struct ProxyGuard {
    cluster: Option<Arc<Cluster>>,
}

impl Drop for ProxyGuard {
    fn drop(&mut self) {
        if let Some(cluster) = self.cluster.take() {
            let mut st = cluster.lock();
            st.proxy_running = false;
            for request in std::mem::take(&mut st.queue) {
                st.stats.unknown_not_committed += 1;
                let _ = request.reply.send(Err(StoreError::CommitUnknown));
            }
        }
    }
}

async fn sleep(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}
