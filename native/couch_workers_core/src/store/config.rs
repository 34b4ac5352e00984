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
}

/// Opens the configured store.
pub async fn open(config: &StoreConfig) -> Result<Db, StoreError> {
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
        #[cfg(not(feature = "fdb"))]
        StoreConfig::Fdb { .. } => Err(StoreError::NotBuilt(
            "this couch_workers NIF was built without FoundationDB support: \
             install libfdb_c and rebuild with COUCH_WORKERS_FEATURES=fdb (see README, \"FoundationDB\")"
                .into(),
        )),
    }
}
