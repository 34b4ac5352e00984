//! The FoundationDB store: the [`Database`] and [`Transaction`] traits on
//! FoundationDB itself, through the `foundationdb` crate (API version
//! `network::API_VERSION`, cargo feature `fdb-7_1`).
//!
//! * [`network`]: the client network, booted once per OS process and
//!   stopped once (`network::shutdown_network`).
//! * [`transaction`]: one FDB transaction behind the store's trait.
//!
//! The key space lives under the directory-layer directory `couchdb`, the
//! one CouchDB's erlfdb code opens with
//! `erlfdb_directory:create_or_open(Tx, erlfdb_directory:root(), [<<"couchdb">>])`:
//! erlfdb turns a binary path element into a unicode string (`{utf8, Bin}`),
//! which is what the Rust directory layer packs a `String` to, so both find
//! the same directory and prefix.
//!
//! FDB error codes map onto [`StoreError`] as follows: 1020 `Conflict`,
//! 1007 `TooOld`, 1021 `CommitUnknown`, 1031 `TimedOut`, 2101
//! `TransactionTooLarge`, 2102 `KeyTooLarge`, 2103 `ValueTooLarge`, every
//! other code `Fdb { code, message, retryable }` with FDB's own
//! `retryable` predicate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use foundationdb::directory::{Directory, DirectoryError, DirectoryLayer, DirectoryOutput};
use foundationdb::options::TransactionOption;
use foundationdb::{FdbBindingError, FdbError};
use tokio_util::sync::CancellationToken;

use super::{Database, StoreError, Tx, TxOptions};

pub mod network;
pub mod transaction;

// The network's state, for the tests.
#[cfg(any(test, feature = "internals"))]
pub use network::{network_status, NetworkStatus};
pub use transaction::FdbTransaction;

/// The directory the key space lives under, as CouchDB's code names it.
pub const COUCHDB_DIRECTORY: &str = "couchdb";

/// The directory under which test stores (`StoreConfig::FdbTest`, the
/// live conformance suite) live, each in its own subdirectory.
pub const TEST_DIRECTORY: &str = "couch_workers_test";

/// How long opening (or removing) the directory may take, retries
/// included, before `open` gives up with `TimedOut` (an unreachable
/// cluster would otherwise make FDB retry forever).
const DIRECTORY_TIMEOUT_MS: i32 = 30_000;

/// Maps an FDB error onto the store's errors.
pub fn map_fdb_error(e: FdbError) -> StoreError {
    match e.code() {
        1020 => StoreError::Conflict,
        1007 => StoreError::TooOld,
        1021 => StoreError::CommitUnknown,
        1031 => StoreError::TimedOut,
        2101 => StoreError::TransactionTooLarge,
        2102 => StoreError::KeyTooLarge,
        2103 => StoreError::ValueTooLarge,
        code => StoreError::Fdb { code, message: e.message().to_string(), retryable: e.is_retryable() },
    }
}

/// The FDB error code behind a store error, for `on_error`; `None` for an
/// error FDB did not raise.
pub(crate) fn fdb_code(err: &StoreError) -> Option<i32> {
    match err {
        StoreError::Conflict => Some(1020),
        StoreError::TooOld => Some(1007),
        StoreError::CommitUnknown => Some(1021),
        StoreError::TimedOut => Some(1031),
        StoreError::TransactionTooLarge => Some(2101),
        StoreError::KeyTooLarge => Some(2102),
        StoreError::ValueTooLarge => Some(2103),
        StoreError::Fdb { code, .. } => Some(*code),
        _ => None,
    }
}

fn map_binding_error(e: FdbBindingError) -> StoreError {
    if let Some(fdb) = e.get_fdb_error() {
        return map_fdb_error(fdb);
    }
    match e {
        FdbBindingError::DirectoryError(DirectoryError::IncompatibleLayer) => StoreError::Invalid(
            "the FoundationDB directory exists with another layer than couch_workers expects".into(),
        ),
        other => StoreError::Invalid(format!("FoundationDB directory layer: {other:?}")),
    }
}

/// A FoundationDB database with the key space under a directory.
pub struct FdbStore {
    db: foundationdb::Database,
    cluster_file: PathBuf,
    /// The directory's path from the root (`["couchdb"]` in production).
    path: Vec<String>,
    /// The directory's raw prefix: every key of the key space starts with it.
    prefix: Vec<u8>,
    /// Cancelled by `close` or by `shutdown_network`.
    closed: CancellationToken,
    /// A test store: `close` removes its directory.
    remove_at_close: bool,
}

impl std::fmt::Debug for FdbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FdbStore")
            .field("cluster_file", &self.cluster_file)
            .field("path", &self.path)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl FdbStore {
    /// Opens the cluster of `cluster_file` and the directory `couchdb`
    /// (created when missing). Boots the client network on first use.
    pub async fn open(cluster_file: &Path) -> Result<Arc<FdbStore>, StoreError> {
        Self::open_at(cluster_file, &[COUCHDB_DIRECTORY]).await
    }

    /// Same under another directory path, e.g.
    /// `["couch_workers_test", "<random>"]` for tests, which remove it with
    /// [`FdbStore::remove_directory`] afterwards.
    pub async fn open_at(cluster_file: &Path, path: &[&str]) -> Result<Arc<FdbStore>, StoreError> {
        Self::open_with(cluster_file, path, false).await
    }

    /// The store of `StoreConfig::FdbTest`: under
    /// `["couch_workers_test", name]`, which [`Database::close`] removes
    /// when `owner` (a node joining another's test store passes `false`).
    pub async fn open_test(cluster_file: &Path, name: &str, owner: bool) -> Result<Arc<FdbStore>, StoreError> {
        Self::open_with(cluster_file, &[TEST_DIRECTORY, name], owner).await
    }

    async fn open_with(cluster_file: &Path, path: &[&str], remove_at_close: bool) -> Result<Arc<FdbStore>, StoreError> {
        if path.is_empty() {
            return Err(StoreError::Invalid("an FDB store needs a directory path, not the root".into()));
        }
        // Checked before the crate makes a CString of it (a NUL panics).
        let cluster = super::cluster_file::cluster_file_arg(cluster_file)?;
        network::ensure_running()?;
        let db = foundationdb::Database::new(Some(cluster)).map_err(map_fdb_error)?;
        let path: Vec<String> = path.iter().map(|p| p.to_string()).collect();
        let closed = network::shutdown_token();
        let dir = {
            let path = &path;
            let open = db.run(|trx, _maybe_committed| async move {
                trx.set_option(TransactionOption::Timeout(DIRECTORY_TIMEOUT_MS))?;
                let dir = DirectoryLayer::default().create_or_open(&trx, path, None, None).await?;
                Ok(dir)
            });
            tokio::select! {
                biased;
                _ = closed.cancelled() => return Err(StoreError::Closed),
                dir = open => dir.map_err(map_binding_error)?,
            }
        };
        let prefix = match &dir {
            DirectoryOutput::DirectorySubspace(subspace) => subspace.bytes().to_vec(),
            DirectoryOutput::DirectoryPartition(_) => {
                return Err(StoreError::Invalid(format!(
                    "the FoundationDB directory {path:?} is a directory partition, not a directory"
                )))
            }
        };
        Ok(Arc::new(FdbStore { db, cluster_file: cluster_file.to_path_buf(), path, prefix, closed, remove_at_close }))
    }

    /// Removes this store's directory and everything in it (for tests).
    /// Returns whether it existed.
    pub async fn remove_directory(&self) -> Result<bool, StoreError> {
        let path = &self.path;
        let remove = self.db.run(|trx, _maybe_committed| async move {
            trx.set_option(TransactionOption::Timeout(DIRECTORY_TIMEOUT_MS))?;
            Ok(DirectoryLayer::default().remove_if_exists(&trx, path).await?)
        });
        tokio::select! {
            biased;
            _ = self.closed.cancelled() => Err(StoreError::Closed),
            removed = remove => removed.map_err(map_binding_error),
        }
    }
}

#[async_trait]
impl Database for FdbStore {
    async fn create_transaction(&self, opts: &TxOptions) -> Result<Tx, StoreError> {
        if self.closed.is_cancelled() {
            return Err(StoreError::Closed);
        }
        let tx = self.db.create_trx().map_err(map_fdb_error)?;
        Ok(Arc::new(FdbTransaction::new(tx, opts, self.closed.clone())?))
    }

    fn prefix(&self) -> Vec<u8> {
        self.prefix.clone()
    }

    fn kind(&self) -> &'static str {
        "fdb"
    }

    fn durability(&self) -> String {
        format!(
            "FoundationDB (cluster file {}, directory {:?}): commits are durable per the cluster's redundancy mode",
            self.cluster_file.display(),
            self.path
        )
    }

    fn close(&self) {
        if self.remove_at_close && !self.closed.is_cancelled() {
            // A test store's directory goes with it. Blocking here is
            // fine: its futures are driven by FDB's network thread, not
            // by the runtime, and only test runs close such a store.
            if let Err(e) = futures::executor::block_on(self.remove_directory()) {
                eprintln!("couch_workers: could not remove the test directory {:?}: {e}", self.path);
            }
        }
        self.closed.cancel();
    }
}
