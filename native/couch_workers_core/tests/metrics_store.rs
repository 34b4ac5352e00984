//! The retry loop's counters (`metrics.rs`) move by exactly what the loop
//! did. One test in its own binary: the counters are process-wide, and no
//! other test (nor any node's background task) runs transactions here.

use std::sync::atomic::{AtomicU32, Ordering};

use couch_workers_core::metrics::{StoreCounts, STORE};
use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::{run, Db, StoreError, TxOptions};

fn delta(before: StoreCounts) -> StoreCounts {
    let now = STORE.snapshot();
    StoreCounts {
        transactions: now.transactions - before.transactions,
        conflicts: now.conflicts - before.conflicts,
        retries: now.retries - before.retries,
        failures: now.failures - before.failures,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn attempts_conflicts_retries_and_failures_are_counted_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let db: Db = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).unwrap();

    let before = STORE.snapshot();
    run(db.as_ref(), TxOptions::write(), |tx| async move {
        tx.set(b"k", b"v");
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(delta(before), StoreCounts { transactions: 1, conflicts: 0, retries: 0, failures: 0 });

    // Two conflicts, then a commit: three attempts, two retries.
    let before = STORE.snapshot();
    let tries = AtomicU32::new(0);
    let tries = &tries;
    run(db.as_ref(), TxOptions::read(), |tx| async move {
        if tries.fetch_add(1, Ordering::SeqCst) < 2 {
            return Err(StoreError::Conflict);
        }
        tx.get(b"k", false).await
    })
    .await
    .unwrap();
    assert_eq!(delta(before), StoreCounts { transactions: 3, conflicts: 2, retries: 2, failures: 0 });

    // A busy store is retried but is no conflict; an I/O error ends the run.
    let before = STORE.snapshot();
    let tries = AtomicU32::new(0);
    let tries = &tries;
    let e = run(db.as_ref(), TxOptions::read(), |_tx| async move {
        if tries.fetch_add(1, Ordering::SeqCst) == 0 {
            Err::<(), _>(StoreError::Busy)
        } else {
            Err(StoreError::Io("disk".into()))
        }
    })
    .await
    .unwrap_err();
    assert_eq!(e.name(), "store_io");
    assert_eq!(delta(before), StoreCounts { transactions: 2, conflicts: 0, retries: 1, failures: 1 });
}
