//! A process that used FoundationDB exits cleanly (status 0, no signal)
//! without stopping the network itself: the exit handler stops it.
//! Before, `fdb_stop_network` ran on the exiting thread after its C++
//! `thread_local`s were gone, and every such process died with SIGSEGV at
//! exit. Live: needs `FDB_CLUSTER_FILE` (see tests/conformance_fdb.rs).
#![cfg(feature = "fdb")]

use std::path::PathBuf;
use std::process::Command;

use couch_workers_core::store::fdb::FdbStore;
use couch_workers_core::store::{Database, TxOptions};

const CHILD: &str = "COUCH_WORKERS_FDB_EXIT_CHILD";

/// The child's work: opens a store, commits, reads, and returns without
/// any shutdown call (the harness then exits the process).
async fn use_fdb(cluster: PathBuf) {
    let db = FdbStore::open_test(&cluster, "exit_child", true).await.expect("open");
    let key = [db.prefix().as_slice(), b"k"].concat();
    let tx = db.create_transaction(&TxOptions::write()).await.expect("transaction");
    tx.set(&key, b"v");
    tx.commit().await.expect("commit");
    let tx = db.create_transaction(&TxOptions::read()).await.expect("transaction");
    assert_eq!(tx.get(&key, false).await.expect("read"), Some(b"v".to_vec()));
    db.close();
}

/// Runs itself as the child (the same test, with [`CHILD`] set) and
/// checks how the child's process ended.
#[test]
#[ignore = "needs a FoundationDB cluster: FDB_CLUSTER_FILE=... cargo test --features fdb --test fdb_exit -- --include-ignored"]
fn a_process_that_used_fdb_exits_cleanly() {
    if let Some(cluster) = std::env::var_os(CHILD) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        rt.block_on(use_fdb(PathBuf::from(cluster)));
        return;
    }
    let cluster = std::env::var_os("FDB_CLUSTER_FILE")
        .filter(|v| !v.is_empty())
        .expect("FDB_CLUSTER_FILE: the cluster file of a test cluster (scripts/fdb-cluster.sh run -- ...)");
    let out = Command::new(std::env::current_exe().expect("own path"))
        .args(["--exact", "a_process_that_used_fdb_exits_cleanly", "--include-ignored", "--test-threads=1"])
        .env(CHILD, cluster)
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("1 passed"), "the child ran its work: {stdout}");
    assert!(
        out.status.success(),
        "the child must exit with status 0, got {:?} (signal {:?}); stderr: {}",
        out.status.code(),
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        String::from_utf8_lossy(&out.stderr)
    );
}
