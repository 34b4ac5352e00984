//! Choosing and opening a store from the application's configuration.

use std::path::PathBuf;

use super::{Db, StoreError};

/// The `store` setting of the `couch_workers` application.
#[derive(Debug, Clone)]
pub enum StoreConfig {
    /// `{embedded, Dir}`: SQLite in WAL mode under `Dir`.
    Embedded(super::embedded::EmbeddedOptions),
    /// `{fdb, ClusterFile}`: FoundationDB.
    Fdb { cluster_file: PathBuf },
    /// `{fdb_test, ClusterFile, Name}`: FoundationDB under its own
    /// directory `["couch_workers_test", Name]`, removed with everything in
    /// it when the store closes: the EUnit suites' store when
    /// `FDB_CLUSTER_FILE` is set, one name per app start, so that runs
    /// never meet. It never touches anything outside that subtree.
    /// `{fdb_test, ClusterFile, Name, shared}` (`owner: false`): the same
    /// directory, joined by another node of a multi-node test, which
    /// leaves it in place when it closes (the owner removes it).
    FdbTest { cluster_file: PathBuf, name: String, owner: bool },
}

impl StoreConfig {
    /// The embedded store under `dir`, with its defaults.
    pub fn embedded(dir: impl Into<PathBuf>) -> StoreConfig {
        StoreConfig::Embedded(super::embedded::EmbeddedOptions::new(dir))
    }

    /// The embedded store under `dir`, whose watchers look at the store
    /// at least every `safety_look` (`EmbeddedOptions::safety_look`).
    pub fn embedded_with_safety_look(dir: impl Into<PathBuf>, safety_look: std::time::Duration) -> StoreConfig {
        let mut opts = super::embedded::EmbeddedOptions::new(dir);
        opts.safety_look = safety_look;
        StoreConfig::Embedded(opts)
    }

    /// The embedded store's default safety look.
    pub const EMBEDDED_SAFETY_LOOK: std::time::Duration = super::embedded::SAFETY_LOOK;
}

/// Opens the configured store. A bad cluster-file path is `invalid` on
/// every build, before the question of whether FDB is built in.
pub async fn open(config: &StoreConfig) -> Result<Db, StoreError> {
    if let StoreConfig::Fdb { cluster_file } | StoreConfig::FdbTest { cluster_file, .. } = config {
        super::cluster_file::cluster_file_arg(cluster_file)?;
    }
    if let StoreConfig::FdbTest { name, .. } = config {
        if name.is_empty() || name.contains('\0') {
            return Err(StoreError::Invalid("an fdb_test store needs a name without NUL bytes".into()));
        }
    }
    match config {
        StoreConfig::Embedded(opts) => {
            let store = super::embedded::EmbeddedStore::open(opts.clone())?;
            Ok(store as Db)
        }
        #[cfg(feature = "fdb")]
        StoreConfig::Fdb { cluster_file } => {
            let store = super::fdb::FdbStore::open(cluster_file).await?;
            Ok(store as Db)
        }
        #[cfg(feature = "fdb")]
        StoreConfig::FdbTest { cluster_file, name, owner } => {
            let store = super::fdb::FdbStore::open_test(cluster_file, name, *owner).await?;
            Ok(store as Db)
        }
        #[cfg(not(feature = "fdb"))]
        StoreConfig::Fdb { .. } | StoreConfig::FdbTest { .. } => Err(StoreError::NotBuilt(
            "this couch_workers NIF was built without FoundationDB support: \
             install libfdb_c and rebuild with COUCH_WORKERS_FEATURES=fdb (see README, \"FoundationDB\")"
                .into(),
        )),
    }
}
