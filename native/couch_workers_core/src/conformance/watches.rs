//! Watches.

use std::time::{Duration, Instant};

use super::helpers::{get, key, put, wait_watch, write};
use super::StoreFactory;
use crate::store::{run, Db, StoreError, TxOptions};

/// Creates a watch on `k` in a committed transaction.
async fn watch(db: &Db, k: &[u8]) -> crate::store::Watch {
    run(&**db, TxOptions::read(), |tx| async move { Ok(tx.watch(k)) }).await.expect("watch")
}

/// A watch fires after a change made through the same handle, for a
/// changed value, a cleared key and a key that did not exist.
pub async fn watch_fires_on_own_change(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let db = &t.db;
    let k = &key(db, b"w/own");
    put(db, k, b"1").await;
    let w = watch(db, k).await;
    put(db, k, b"2").await;
    assert_eq!(wait_watch(w, Duration::from_secs(2)).await, Some(Ok(())), "fires on a changed value");
    let w = watch(db, k).await;
    write(db, |tx| tx.clear(k)).await;
    assert_eq!(wait_watch(w, Duration::from_secs(2)).await, Some(Ok(())), "fires on a clear");
    let w = watch(db, k).await;
    put(db, k, b"3").await;
    assert_eq!(wait_watch(w, Duration::from_secs(2)).await, Some(Ok(())), "fires when a missing key appears");
    // A watch set in a transaction that itself writes the key watches the
    // written value.
    let w = run(&**db, TxOptions::write(), |tx| async move {
        tx.set(k, b"4");
        Ok(tx.watch(k))
    })
    .await
    .expect("watch");
    put(db, k, b"5").await;
    assert_eq!(wait_watch(w, Duration::from_secs(2)).await, Some(Ok(())), "fires after its own write is changed");
}

/// A watch fires after a change made through a second handle (another
/// node), quickly. Returns the median latency from the writer's commit to
/// the watch firing over five changes (asserted under 100 ms).
pub async fn watch_fires_on_other_handle_change(s: &dyn StoreFactory) -> Duration {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let k = &key(&a.db, b"w/other");
    put(&a.db, k, b"0").await;
    let mut latencies = Vec::new();
    for i in 1u8..=5 {
        let w = watch(&a.db, k).await;
        let waiter = tokio::spawn(async move {
            let r = w.await;
            (r, Instant::now())
        });
        // Let the watch settle (FDB registers it with a storage server).
        tokio::time::sleep(Duration::from_millis(20)).await;
        put(&b.db, k, &[i]).await;
        let committed = Instant::now();
        let (result, fired) = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .expect("watch fires within 2 s")
            .expect("waiter task");
        assert_eq!(result, Ok(()));
        latencies.push(fired.saturating_duration_since(committed));
    }
    latencies.sort();
    let median = latencies[latencies.len() / 2];
    assert!(median < Duration::from_millis(100), "median watch latency {median:?} ({latencies:?})");
    median
}

/// Dropping a watch is harmless: later changes and later watches work.
pub async fn dropped_watch_is_harmless(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let db = &t.db;
    let k = &key(db, b"w/drop");
    put(db, k, b"1").await;
    for _ in 0..10 {
        drop(watch(db, k).await);
    }
    put(db, k, b"2").await;
    let w = watch(db, k).await;
    put(db, k, b"3").await;
    assert_eq!(wait_watch(w, Duration::from_secs(2)).await, Some(Ok(())));
}

/// A watch whose transaction does not commit resolves with an error:
/// dropped without commit, or failed by its closure.
pub async fn watch_of_uncommitted_transaction_fails(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let db = &t.db;
    let k = &key(db, b"w/uncommitted");
    let tx = db.create_transaction(&TxOptions::write()).await.expect("transaction");
    let w = tx.watch(k);
    tx.set(k, b"x");
    drop(tx);
    match wait_watch(w, Duration::from_secs(2)).await {
        Some(Err(_)) => {}
        other => panic!("watch of a dropped transaction: expected an error, got {other:?}"),
    }
    let slot = std::sync::Mutex::new(None);
    let slot = &slot;
    let result: Result<(), _> = run(&**db, TxOptions::write(), |tx| async move {
        *slot.lock().expect("slot") = Some(tx.watch(k));
        Err(StoreError::Invalid("no".into()))
    })
    .await;
    assert!(result.is_err());
    let w = slot.lock().expect("slot").take().expect("watch created");
    match wait_watch(w, Duration::from_secs(2)).await {
        Some(Err(_)) => {}
        other => panic!("watch of a failed transaction: expected an error, got {other:?}"),
    }
    assert_eq!(get(db, k).await, None);
}

/// `close()` fails the pending watches of that handle with `Closed`, is
/// idempotent, makes new transactions fail with `Closed`, and leaves other
/// handles on the same store working.
pub async fn close_fails_pending_watches(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let k = &key(&a.db, b"w/close");
    put(&b.db, k, b"1").await;
    let w = watch(&b.db, k).await;
    b.db.close();
    b.db.close();
    assert_eq!(wait_watch(w, Duration::from_secs(2)).await, Some(Err(StoreError::Closed)));
    match b.db.create_transaction(&TxOptions::write()).await {
        Err(StoreError::Closed) => {}
        Err(other) => panic!("transaction after close: expected Closed, got {other}"),
        Ok(_) => panic!("transaction after close: expected Closed, got a transaction"),
    }
    // The other handle is unaffected.
    let w = watch(&a.db, k).await;
    put(&a.db, k, b"2").await;
    assert_eq!(wait_watch(w, Duration::from_secs(2)).await, Some(Ok(())));
}
