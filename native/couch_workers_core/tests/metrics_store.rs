//! The retry loop's counters (`metrics.rs`) move by exactly what the loop
//! did: they are fed from each run's `transaction` span, with no node (and
//! so no `Logger`) in this process. One test in its own binary: the
//! counters are process-wide, and no other test (nor any node's background
//! task) runs transactions here.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use couch_workers_core::log::count;
use couch_workers_core::metrics::{StoreCounts, STORE};
use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::sim::{SimOptions, SimStore};
use couch_workers_core::store::{run, Db, StoreError, TxOptions};
use tracing_subscriber::layer::SubscriberExt;

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

    // A conflict the store itself found (the sim store checks read
    // conflicts as FDB does): the first attempt reads `k`, another
    // transaction writes it and commits, the first one's commit conflicts
    // and its second attempt commits.
    let sim: Db = SimStore::new(SimOptions::new(11));
    let before = STORE.snapshot();
    let tries = AtomicU32::new(0);
    let (tries, sim_ref) = (&tries, &sim);
    run(sim.as_ref(), TxOptions::write(), |tx| async move {
        tx.get(b"k", false).await?;
        if tries.fetch_add(1, Ordering::SeqCst) == 0 {
            run(sim_ref.as_ref(), TxOptions::write(), |other| async move {
                other.set(b"k", b"theirs");
                Ok(())
            })
            .await?;
        }
        tx.set(b"k", b"ours");
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(tries.load(Ordering::SeqCst), 2, "the first commit conflicted");
    assert_eq!(delta(before), StoreCounts { transactions: 3, conflicts: 1, retries: 1, failures: 0 });

    // A run its caller stops waiting for, in its second attempt after a
    // conflict: what it did is counted (no outcome, so no failure).
    let before = STORE.snapshot();
    let tries = AtomicU32::new(0);
    let tries = &tries;
    let dropped = tokio::time::timeout(
        Duration::from_millis(200),
        run(db.as_ref(), TxOptions::read(), |_tx| async move {
            if tries.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err::<(), _>(StoreError::Conflict);
            }
            std::future::pending().await
        }),
    )
    .await;
    assert!(dropped.is_err(), "the second attempt never ends");
    assert_eq!(tries.load(Ordering::SeqCst), 2);
    assert_eq!(delta(before), StoreCounts { transactions: 2, conflicts: 1, retries: 1, failures: 0 });

    // A host's own subscriber in place of the process's (here for this
    // thread only; the test's body is polled on it): its registry counts
    // with `log::count()` among its layers, and without it does not.
    let db = &db;
    let conflict_then_commit = || {
        let tries = AtomicU32::new(0);
        async move {
            let tries = &tries;
            run(db.as_ref(), TxOptions::write(), |tx| async move {
                if tries.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err(StoreError::Conflict);
                }
                tx.set(b"k", b"v");
                Ok(())
            })
            .await
            .unwrap()
        }
    };
    {
        let _host = tracing::subscriber::set_default(tracing_subscriber::registry().with(count()));
        let before = STORE.snapshot();
        conflict_then_commit().await;
        assert_eq!(delta(before), StoreCounts { transactions: 2, conflicts: 1, retries: 1, failures: 0 });
    }
    {
        let _host = tracing::subscriber::set_default(tracing_subscriber::registry());
        let before = STORE.snapshot();
        conflict_then_commit().await;
        assert_eq!(delta(before), StoreCounts::default(), "a host's subscriber without the counting layer");
    }
}
