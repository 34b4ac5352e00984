//! The membership log's floor (`("couch_workers", "workers", Type,
//! "log_floor")`) never moves backwards, on the `sim` store and on a live
//! FoundationDB: two changes
//! of one type that do not conflict may commit in either order, and the
//! one with the older read version must not lower the floor the other set
//! (FoundationDB's BYTE_MAX over the big-endian version, not a `set`).

use couch_workers_core::keyspace::Keyspace;
use couch_workers_core::roster;
use couch_workers_core::store::{run, Db, TxOptions};
use couch_workers_core::test_store::{StoreKind, TestStore};
use couch_workers_core::workers::{self, WorkerSpec, LOG_RETENTION_VERSIONS};

const T: &[u8] = b"floor_type";

fn spec(id: &str) -> WorkerSpec {
    WorkerSpec { worker_type: T.to_vec(), id: id.as_bytes().to_vec(), options_json: b"{}".to_vec(), timeout_s: 30 }
}

async fn floor(db: &Db, ks: &Keyspace) -> Option<u64> {
    let key = &ks.membership_log_floor(T);
    run(db.as_ref(), TxOptions::read(), |tx| async move { tx.get(key, false).await })
        .await
        .expect("read floor")
        .map(|v| u64::from_be_bytes(v.as_slice().try_into().expect("8-byte floor")))
}

/// Waits (up to 90 s) until the store's read versions are past
/// [`LOG_RETENTION_VERSIONS`].
async fn past_the_retention_window(db: &Db) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    loop {
        let rv = run(db.as_ref(), TxOptions::read(), |tx| async move { tx.read_version().await })
            .await
            .expect("read version");
        if rv > LOG_RETENTION_VERSIONS + liveness_margin() {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "read versions stay below the retention window: {rv}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// A second of versions past the window, so that the test's first read
/// version is surely past it too.
fn liveness_margin() -> u64 {
    couch_workers_core::store::VERSIONS_PER_SECOND
}

async fn an_older_change_committed_last_does_not_lower_the_log_floor(kind: StoreKind) {
    let store = TestStore::with_seed(kind, 77);
    let db: Db = store.db();
    // Versions past the retention window, so that changes trim the log:
    // a recovery's jump on the sim. A live cluster's versions follow its
    // clock from its creation (a fresh test cluster reads about 5 million
    // at first; this test once failed there, below the window, where no
    // change writes a floor at all): wait until its first minute is over.
    match store.sim_cluster() {
        Some(sim) => sim.recover(),
        None => past_the_retention_window(&db).await,
    }
    let ks = Keyspace::new(&db.prefix());
    let other = &ks.membership_log_floor(b"unrelated");

    let older = db.create_transaction(&TxOptions::write()).await.expect("transaction");
    roster::register(&older, &ks, &spec("a"), &workers::new_incarnation(), 0).await.expect("register a");
    let older_rv = older.read_version().await.expect("read version");
    assert!(older_rv > LOG_RETENTION_VERSIONS, "versions past the retention window: {older_rv}");

    // Time passes in versions: unrelated commits.
    for _ in 0..3 {
        run(db.as_ref(), TxOptions::write(), |tx| async move {
            tx.set(other, b"x");
            Ok(())
        })
        .await
        .expect("unrelated commit");
    }

    let newer = db.create_transaction(&TxOptions::write()).await.expect("transaction");
    roster::register(&newer, &ks, &spec("b"), &workers::new_incarnation(), 0).await.expect("register b");
    let newer_rv = newer.read_version().await.expect("read version");
    assert!(newer_rv > older_rv, "{newer_rv} > {older_rv}");
    newer.commit().await.expect("newer commits");
    let after_newer = floor(&db, &ks).await.expect("a floor");
    assert_eq!(after_newer, newer_rv - LOG_RETENTION_VERSIONS);

    // The two changes touch different members: no conflict, both commit.
    older.commit().await.expect("older commits (no conflict with the newer change)");
    assert_eq!(floor(&db, &ks).await, Some(after_newer), "the floor moved backwards");
}

couch_workers_core::store_tests!(
    runtime: (),
    stores: [sim: Sim],
    tests: [an_older_change_committed_last_does_not_lower_the_log_floor],
);
