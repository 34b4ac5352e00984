//! The membership log's floor (`("couch_workers", "workers", Type,
//! "log_floor")`) never moves backwards, on the `sim` store: two changes
//! of one type that do not conflict may commit in either order, and the
//! one with the older read version must not lower the floor the other set
//! (FoundationDB's BYTE_MAX over the big-endian version, not a `set`).

use couch_workers_core::keyspace::Keyspace;
use couch_workers_core::store::sim::{SimOptions, SimStore};
use couch_workers_core::store::{run, Db, TxOptions};
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

#[tokio::test]
async fn an_older_change_committed_last_does_not_lower_the_log_floor() {
    let sim = SimStore::new(SimOptions::new(77));
    // Versions past the retention window, so that changes trim the log.
    sim.recover();
    let db: Db = sim.clone();
    let ks = Keyspace::new(&db.prefix());
    let other = &ks.membership_log_floor(b"unrelated");

    let older = db.create_transaction(&TxOptions::write()).await.expect("transaction");
    workers::register(&older, &ks, &spec("a"), &workers::new_incarnation(), 0).await.expect("register a");
    let older_rv = older.read_version().await.expect("read version");

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
    workers::register(&newer, &ks, &spec("b"), &workers::new_incarnation(), 0).await.expect("register b");
    let newer_rv = newer.read_version().await.expect("read version");
    assert!(newer_rv > older_rv, "{newer_rv} > {older_rv}");
    newer.commit().await.expect("newer commits");
    let after_newer = floor(&db, &ks).await.expect("a floor");
    assert_eq!(after_newer, newer_rv - LOG_RETENTION_VERSIONS);

    // The two changes touch different members: no conflict, both commit.
    older.commit().await.expect("older commits (no conflict with the newer change)");
    assert_eq!(floor(&db, &ks).await, Some(after_newer), "the floor moved backwards");
}
