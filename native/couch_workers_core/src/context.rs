//! A node's context: what every service and call of one node shares, made
//! once. The open store, its key space, the node's logger, the options of
//! its read and write transactions, the cancellation every task of the
//! node stops with, and the one way a task is started: [`Context::spawn`]
//! (counted, tracked so that the node's stop waits for it) or
//! [`Context::spawn_supervised`] (restarted by the node's supervisor,
//! `tasks/supervise.rs`).
//!
//! A context alone runs nothing. The stateless job API (`jobs::Jobs`) and
//! the operators' reads below are calls on it; the node's daemons
//! (heartbeat, reaper, membership watchers, the job sweeper, pruner,
//! promoter, accept dispatchers and job watchers) are started by the node
//! (`node.rs`, `jobs::JobService`) and by nothing else. The command line
//! opens a context and never a node, so it runs no service:
//! [`Context::spawned`] proves it.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::Error;
use crate::keyspace::Keyspace;
use crate::log::{Discard, Logger};
use crate::tasks::supervise::{OnFailing, ServiceKind, Supervisor};
use crate::tasks::watch_limit::WatchLimit;
use crate::tasks::Live;
use crate::store::{self, Db, StoreConfig, StoreError, TxOptions};

/// One node's shared context. Held in an `Arc` by every service.
pub struct Context {
    pub(crate) db: Db,
    pub(crate) ks: Keyspace,
    pub(crate) log: Logger,
    /// A read-only transaction of this node (its timeout, retry limit).
    pub(crate) read: TxOptions,
    /// A transaction that writes.
    pub(crate) write: TxOptions,
    /// Parent of every task's token: cancelled when the node stops (or
    /// the context closes).
    pub(crate) cancel: CancellationToken,
    tasks: TaskTracker,
    runtime: Handle,
    /// Restarts the node's long-lived tasks.
    pub(crate) supervisor: Arc<Supervisor>,
    /// The store handle's watch-limit episode, shared by every watcher of
    /// the node: the limit is the handle's.
    pub(crate) watch_limit: Arc<WatchLimit>,
    /// Tasks spawned through this context since it was made.
    spawned: AtomicUsize,
    /// The name the job calls relayed in callers' transactions are
    /// counted under (a node on FoundationDB given its name:
    /// `jobs/tx_counts.rs`); unset, they are not counted.
    pub(crate) tx_counts_name: OnceLock<Vec<u8>>,
}

impl Context {
    /// A context on an open store. Must run on the runtime its tasks will
    /// run on. `tx` gives every transaction's timeout and retry limit.
    pub(crate) fn new(db: Db, log: Logger, tx: TxOptions) -> Arc<Context> {
        let ks = Keyspace::new(&db.prefix());
        Arc::new(Context {
            db,
            ks,
            read: TxOptions { writes: false, ..tx },
            write: TxOptions { writes: true, ..tx },
            cancel: CancellationToken::new(),
            tasks: TaskTracker::new(),
            runtime: Handle::current(),
            supervisor: Supervisor::new(log.clone()),
            watch_limit: Arc::new(WatchLimit::new(log.clone())),
            log,
            spawned: AtomicUsize::new(0),
            tx_counts_name: OnceLock::new(),
        })
    }

    /// Opens the configured store for the stateless calls alone (the
    /// command line): no node, no service, events discarded. Must run on
    /// a runtime. [`Context::close`] closes the store.
    pub async fn open(config: &StoreConfig) -> Result<Arc<Context>, Error> {
        let db = store::open(config).await?;
        Ok(Context::new(db, Logger::new(Arc::new(Discard)), TxOptions::default()))
    }

    /// Cancels every task and closes the store: calls then answer
    /// `store_closed`.
    pub fn close(&self) {
        self.cancel.cancel();
        self.db.close();
    }

    /// Cancels every task and waits for each to end (the store stays
    /// open: the node closes it after its last words).
    pub(crate) async fn stop_tasks(&self) {
        self.cancel.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// How many tasks were spawned through this context since it was
    /// made, supervised or not (each counted once, however often its
    /// supervisor restarts it).
    pub fn spawned(&self) -> usize {
        self.spawned.load(Ordering::SeqCst)
    }

    pub fn is_closed(&self) -> bool {
        self.cancel.is_cancelled()
    }

    pub(crate) fn check_open(&self) -> Result<(), Error> {
        if self.is_closed() {
            Err(Error::Store(StoreError::Closed))
        } else {
            Ok(())
        }
    }

    pub(crate) fn runtime(&self) -> &Handle {
        &self.runtime
    }

    /// Spawns a task that stops with the node (its stop waits for it).
    pub(crate) fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.spawned.fetch_add(1, Ordering::SeqCst);
        self.tasks.spawn_on(task, &self.runtime);
    }

    /// Spawns a supervised task of `kind` (see `tasks::supervise`),
    /// counted live in `count` for as long as it is supervised.
    pub(crate) fn spawn_supervised<F, Fut>(
        &self,
        kind: ServiceKind,
        label: Vec<u8>,
        cancel: CancellationToken,
        count: Option<&Arc<AtomicUsize>>,
        factory: F,
        on_failing: Option<OnFailing>,
    ) where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let live = count.map(Live::new);
        let supervised = self.supervisor.supervise(kind, label, cancel, factory, on_failing);
        self.spawn(async move {
            let _live = live;
            supervised.await
        });
    }
}
