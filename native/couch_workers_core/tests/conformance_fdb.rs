//! The store conformance suite (`src/conformance.rs`) on a live
//! FoundationDB cluster.
//!
//! It needs libfdb_c to link and a cluster to run, neither of which the
//! project's CI machines have: there, `scripts/check-fdb.sh` only
//! type-checks this file (`cargo check --tests --features fdb`). On a
//! machine with both:
//!
//! ```sh
//! FDB_CLUSTER_FILE=/etc/foundationdb/fdb.cluster \
//!     cargo test -p couch_workers_core --features fdb --test conformance_fdb -- --include-ignored
//! ```
//!
//! The suite's tests are marked `#[ignore]`, so that a plain `cargo test`
//! reports them as *ignored*, never as passed, and
//! `fdb_conformance_skipped_without_cluster` prints a loud `SKIPPED:` line
//! to standard error when `FDB_CLUSTER_FILE` is unset. Run with
//! `--include-ignored` but without the variable, every suite test fails
//! with that line: no conformance test ever passes without a cluster.
//!
//! Each fresh store is a new directory `("couch_workers_test", <pid>-<random>)`,
//! removed when the test ends; the `couchdb` directory is never touched.
//! A second handle (`open_second`) is a second FDB database handle on the
//! same directory: its own connections and watches, the same network thread
//! (FoundationDB allows one per process).
#![cfg(feature = "fdb")]

use couch_workers_core::conformance::TestDb;
use couch_workers_core::store::fdb::{network_status, FdbStore, NetworkStatus};
use couch_workers_core::store::{run, Database, TxOptions};
use couch_workers_core::test_store::{fdb_cluster_file as cluster_file, fdb_loud_skip as loud_skip};
use couch_workers_core::test_store::{fdb_require_cluster as require_cluster, FdbTestDir};

async fn open_fresh() -> TestDb {
    let dir = FdbTestDir::new(require_cluster());
    let store = dir.open().await;
    TestDb { db: store, guard: Box::new(dir) }
}

async fn open_second(first: &TestDb) -> TestDb {
    let dir = first.guard.downcast_ref::<FdbTestDir>().expect("FDB guard is the FdbTestDir");
    TestDb { db: dir.open().await, guard: Box::new(()) }
}

/// Without `FDB_CLUSTER_FILE`: prints the loud skip line (and asserts
/// nothing, as its name says). With it: checks that the cluster answers and
/// that a test directory opens with a prefix of its own and is removed.
#[tokio::test(flavor = "multi_thread")]
async fn fdb_conformance_skipped_without_cluster() {
    let Some(cluster) = cluster_file() else {
        loud_skip();
        return;
    };
    let dir = FdbTestDir::new(cluster.clone());
    let store = dir.open().await;
    assert_eq!(network_status(), NetworkStatus::Running);
    assert_eq!(store.kind(), "fdb");
    let prefix = store.prefix();
    assert!(!prefix.is_empty() && prefix[0] != 0xff, "directory prefix {prefix:02x?}");
    let key = [prefix.as_slice(), b"smoke"].concat();
    let key = &key;
    run(&*store, TxOptions::write(), |tx| async move {
        tx.set(key, b"1");
        Ok(())
    })
    .await
    .expect("write to the test directory");
    let read = run(&*store, TxOptions::read(), |tx| async move { tx.get(key, false).await }).await;
    assert_eq!(read, Ok(Some(b"1".to_vec())));
    // The same path opens the same directory.
    let again = FdbStore::open_at(&cluster, &dir.path()).await.expect("reopen");
    assert_eq!(again.prefix(), prefix);
    assert_eq!(store.remove_directory().await, Ok(true));
    assert_eq!(store.remove_directory().await, Ok(false));
    eprintln!("FoundationDB conformance suite: run with `-- --include-ignored` to run it against {cluster:?}");
}

couch_workers_core::store_conformance_tests!(
    open_fresh,
    open_second,
    attrs: #[ignore = "needs a FoundationDB cluster: FDB_CLUSTER_FILE=... cargo test --features fdb --test conformance_fdb -- --include-ignored"]
);

/// The key-space conformance suite (`src/conformance_keyspace.rs`):
/// workers, membership and the job queue on FoundationDB, gated the same
/// way (ignored; each test fails with the loud skip line when run without
/// `FDB_CLUSTER_FILE`).
mod keyspace {
    couch_workers_core::keyspace_conformance_tests!(
        super::open_fresh,
        super::open_second,
        attrs: #[ignore = "needs a FoundationDB cluster: FDB_CLUSTER_FILE=... cargo test --features fdb --test conformance_fdb -- --include-ignored"]
    );
}
