//! What a failed commit answers on FoundationDB, live: an outcome FDB
//! calls unknown (1021, 1039) or a commit cut off by the transaction's
//! `timeout` option (1031: the commit request may already be applied) is
//! `CommitUnknown`, never an error that says the write did not happen;
//! a conflict or a too-old transaction is a definite "not committed".
//! Needs `FDB_CLUSTER_FILE` (see tests/conformance_fdb.rs).
#![cfg(feature = "fdb")]

use std::time::Duration;

use couch_workers_core::store::fdb::transaction::commit_error;
use couch_workers_core::store::{Database, StoreError, TxOptions};
use couch_workers_core::test_store::FdbTestDir;
use foundationdb::FdbError;

fn cluster() -> std::path::PathBuf {
    std::env::var_os("FDB_CLUSTER_FILE")
        .filter(|v| !v.is_empty())
        .map(Into::into)
        .expect("NOT RUN: FDB_CLUSTER_FILE is not set (scripts/fdb-cluster.sh run -- ...)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a FoundationDB cluster (FDB_CLUSTER_FILE)"]
async fn a_commit_cut_off_by_the_timeout_option_is_unknown() {
    let dir = FdbTestDir::new(cluster());
    let db = dir.open().await;
    // The store gives FDB's `timeout` option the retry loop's budget.
    let opts = TxOptions { timeout: Duration::from_millis(1), ..TxOptions::write() };
    let tx = db.create_transaction(&opts).await.expect("transaction");
    tokio::time::sleep(Duration::from_millis(50)).await;
    tx.set(&[db.prefix().as_slice(), b"k"].concat(), b"v");
    assert_eq!(tx.commit().await.map(|_| ()), Err(StoreError::CommitUnknown));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a FoundationDB cluster (FDB_CLUSTER_FILE)"]
async fn commit_errors_follow_fdbs_meaning() {
    // A store first: FDB's error predicates need the client selected.
    let dir = FdbTestDir::new(cluster());
    let _db = dir.open().await;
    let cases = [
        (1020, StoreError::Conflict),
        (1007, StoreError::TooOld),
        (1021, StoreError::CommitUnknown),
        (1039, StoreError::CommitUnknown),
        (1031, StoreError::CommitUnknown),
        (2101, StoreError::TransactionTooLarge),
    ];
    for (code, want) in cases {
        assert_eq!(commit_error(FdbError::from_code(code)), want, "commit error {code}");
    }
}
