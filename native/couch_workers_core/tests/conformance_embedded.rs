//! The store conformance suite on the embedded store, plus what only the
//! embedded store promises (no spurious watch fires, swept dropped
//! watches, version clock across re-opens) and rough performance figures.

use couch_workers_core::conformance::TestDb;
use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};

async fn open_fresh() -> TestDb {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open embedded store");
    TestDb { db, guard: Box::new(dir) }
}

async fn open_second(first: &TestDb) -> TestDb {
    let dir = first.guard.downcast_ref::<tempfile::TempDir>().expect("embedded guard is the TempDir");
    let db = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open second handle");
    TestDb { db, guard: Box::new(()) }
}

couch_workers_core::store_conformance_tests!(open_fresh, open_second);

/// The key-space conformance suite (`src/conformance_keyspace.rs`):
/// workers, membership and the job queue on the embedded store.
mod keyspace {
    couch_workers_core::keyspace_conformance_tests!(super::open_fresh, super::open_second);
}
