//! The store and key-space conformance suites on the `sim` store
//! (`store::sim`, FoundationDB's semantics in memory), with no injected
//! faults or latencies: what every store promises holds on it too.
//! The sim store's own semantics (conflicts, versions, faults) have their
//! tests in `tests/sim_store.rs`.

use couch_workers_core::conformance::TestDb;
use couch_workers_core::store::sim::{SimOptions, SimStore};

async fn open_fresh() -> TestDb {
    let store = SimStore::new(SimOptions::new(rand::random()));
    // The guard keeps the first handle, from which `open_second` connects.
    TestDb { db: store.clone(), guard: Box::new(store) }
}

async fn open_second(first: &TestDb) -> TestDb {
    let store = first.guard.downcast_ref::<std::sync::Arc<SimStore>>().expect("sim guard is the first handle");
    TestDb { db: store.connect(), guard: Box::new(()) }
}

couch_workers_core::store_conformance_tests!(open_fresh, open_second);

/// The key-space conformance suite (`src/conformance_keyspace.rs`):
/// workers, membership and the job queue on the sim store.
mod keyspace {
    couch_workers_core::keyspace_conformance_tests!(super::open_fresh, super::open_second);
}

/// Both suites again on a cluster with FoundationDB-like latencies (GRV and
/// reads 0.2-1 ms, commit batches 1.5-2.5 ms): concurrent commits share
/// batches, so transactions of one batch conflict with each other and
/// share a commit version, as on FoundationDB.
mod with_latencies {
    use couch_workers_core::conformance::TestDb;
    use couch_workers_core::store::sim::{SimFaults, SimOptions, SimStore};

    async fn open_fresh() -> TestDb {
        let store = SimStore::new(SimOptions::new(rand::random()).faults(SimFaults::fdb_like_latencies()));
        TestDb { db: store.clone(), guard: Box::new(store) }
    }

    couch_workers_core::store_conformance_tests!(open_fresh, super::open_second);

    mod keyspace {
        couch_workers_core::keyspace_conformance_tests!(super::open_fresh, super::super::open_second);
    }
}
