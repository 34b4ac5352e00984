//! The `sim` store behind a wrapper that scripts one `UnknownCommitted`
//! fault (the commit lands; the caller is told `commit_unknown_result`)
//! for the first commit, once armed, of a transaction that clears a given
//! key, or with `on_set` sets it (a plain or a versionstamped value): exactly the write under test, whatever
//! else the node commits meanwhile (a reaper's pulse, the pruner).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use couch_workers_core::store::hooked::{Hooked, TxHooks, Write};
use couch_workers_core::store::sim::{CommitFault, SimStore};
use couch_workers_core::store::{Database, Db, StoreError, Tx, TxOptions};

pub struct UnknownOnWrite {
    sim: Arc<SimStore>,
    key: Vec<u8>,
    on_set: bool,
    armed: AtomicBool,
}

impl UnknownOnWrite {
    /// The fault waits for a clear of `key` (with `on_set`, a set).
    pub fn new(sim: Arc<SimStore>, key: Vec<u8>, on_set: bool) -> Arc<UnknownOnWrite> {
        Arc::new(UnknownOnWrite { sim, key, on_set, armed: AtomicBool::new(false) })
    }

    /// The wrapped store, for a node.
    pub fn db(self: &Arc<Self>) -> Db {
        Arc::new(Wrapped(self.clone()))
    }

    pub fn sim(&self) -> &Arc<SimStore> {
        &self.sim
    }

    /// Arms the fault; returns the sim's count of landed unknown commits
    /// so far, for [`UnknownOnWrite::fired`].
    pub fn arm(&self) -> u64 {
        self.armed.store(true, Ordering::SeqCst);
        self.sim.stats().unknown_committed
    }

    /// The fault was used, by the write under test.
    pub fn fired(&self, before: u64) {
        assert!(!self.armed.load(Ordering::SeqCst), "the write was committed");
        assert_eq!(self.sim.stats().unknown_committed, before + 1, "one landed commit answered commit_unknown");
    }
}

/// One transaction's hooks: whether it wrote the key, so that its commit
/// gets the fault.
struct Watching {
    fault: Arc<UnknownOnWrite>,
    writes_key: AtomicBool,
}

impl TxHooks for Watching {
    fn write(&self, write: Write<'_>) {
        let f = &self.fault;
        let hit = match write {
            Write::Clear { key } => !f.on_set && key == f.key.as_slice(),
            // A job record's versionstamp is written into its value.
            Write::Set { key, .. } | Write::SetVersionstampedValue { key, .. } => f.on_set && key == f.key.as_slice(),
            _ => false,
        };
        if hit {
            self.writes_key.store(true, Ordering::SeqCst);
        }
    }
    fn commit(&self) {
        if self.writes_key.load(Ordering::SeqCst) && self.fault.armed.swap(false, Ordering::SeqCst) {
            self.fault.sim.inject_commit_fault(CommitFault::UnknownCommitted);
        }
    }
    fn on_error(&self, _err: &StoreError) {
        self.writes_key.store(false, Ordering::SeqCst);
    }
}

struct Wrapped(Arc<UnknownOnWrite>);

#[async_trait]
impl Database for Wrapped {
    async fn create_transaction(&self, opts: &TxOptions) -> Result<Tx, StoreError> {
        let inner = self.0.sim.create_transaction(opts).await?;
        Ok(Arc::new(Hooked::new(inner, Watching { fault: self.0.clone(), writes_key: AtomicBool::new(false) })))
    }
    fn prefix(&self) -> Vec<u8> {
        self.0.sim.prefix()
    }
    fn kind(&self) -> &'static str {
        self.0.sim.kind()
    }
    fn durability(&self) -> String {
        self.0.sim.durability()
    }
    fn versions_follow_time(&self) -> bool {
        self.0.sim.versions_follow_time()
    }
    fn commits_may_be_unknown(&self) -> bool {
        true
    }
    fn close(&self) {
        self.0.sim.close()
    }
}
