//! Serializability and the retry loop.

use std::time::{Duration, Instant};

use super::helpers::{get, get_range, key, le_i64};
use super::StoreFactory;
use crate::store::{run, RangeRequest, StoreError, TxOptions, MAX_VALUE_SIZE};

async fn increments(s: &dyn StoreFactory, opts: TxOptions, per_task: u64) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let counter = key(&a.db, b"inc/counter");
    let log = key(&a.db, b"inc/log/");
    let mut tasks = Vec::new();
    for (i, db) in [a.db.clone(), b.db.clone(), a.db.clone(), b.db.clone()].into_iter().enumerate() {
        let (counter, log) = (counter.clone(), log.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..per_task {
                let (counter, log) = (&counter, &log);
                run(&*db, opts, |tx| async move {
                    let n = match tx.get(counter, false).await? {
                        Some(v) => u64::from_be_bytes(v.as_slice().try_into().expect("8 bytes")),
                        None => 0,
                    };
                    tx.set(counter, &(n + 1).to_be_bytes());
                    // The log key of this increment: a lost update would
                    // write one key twice.
                    tx.set(&[log.as_slice(), &n.to_be_bytes()].concat(), &[i as u8]);
                    Ok(())
                })
                .await
                .expect("increment commits");
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let total = 4 * per_task;
    let n = get(&a.db, &counter).await.expect("counter");
    assert_eq!(u64::from_be_bytes(n.as_slice().try_into().expect("8 bytes")), total);
    let entries = get_range(&b.db, RangeRequest::prefix(&log)).await;
    assert_eq!(entries.len() as u64, total, "one log entry per increment");
}

/// Read-modify-write increments from two handles, concurrently, in write
/// mode: the total is exact.
pub async fn serializable_increments(s: &dyn StoreFactory) {
    increments(s, TxOptions::write(), 25).await;
}

/// The same with the read-mode hint (the embedded store's conflict path).
pub async fn serializable_increments_read_hint(s: &dyn StoreFactory) {
    increments(s, TxOptions::read(), 15).await;
}

/// A closure that always conflicts ends in `RetryLimit` after exactly
/// `retry_limit` attempts.
pub async fn retry_limit_on_persistent_conflict(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let attempts = std::sync::atomic::AtomicU32::new(0);
    let opts = TxOptions { retry_limit: 5, ..TxOptions::write() };
    let result: Result<(), _> = run(&*t.db, opts, |_tx| {
        attempts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async { Err(StoreError::Conflict) }
    })
    .await;
    match result {
        Err(StoreError::RetryLimit { attempts: 5, last }) => assert_eq!(*last, StoreError::Conflict),
        other => panic!("expected RetryLimit after 5 attempts, got {other:?}"),
    }
    assert_eq!(attempts.load(std::sync::atomic::Ordering::SeqCst), 5);
}

/// A closure that always conflicts ends in `TimedOut` once the time
/// budget is spent.
pub async fn retry_timeout_on_persistent_conflict(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let opts = TxOptions { retry_limit: u32::MAX, timeout: Duration::from_millis(200), ..TxOptions::write() };
    let started = Instant::now();
    let result: Result<(), _> = run(&*t.db, opts, |_tx| async { Err(StoreError::Conflict) }).await;
    assert_eq!(result, Err(StoreError::TimedOut));
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(150) && took < Duration::from_millis(1500), "took {took:?}");
}

/// A non-retryable error from the store (a limit) is returned at once,
/// after one attempt, and nothing of the transaction is written.
pub async fn non_retryable_store_error_returned_at_once(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let db = &t.db;
    let (ok, big) = (&key(db, b"nr/ok"), &key(db, b"nr/big"));
    let attempts = std::sync::atomic::AtomicU32::new(0);
    let attempts = &attempts;
    let value = &vec![7u8; MAX_VALUE_SIZE + 1];
    let result = run(&**db, TxOptions::write(), |tx| async move {
        attempts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tx.set(ok, b"x");
        tx.set(big, value);
        Ok(())
    })
    .await;
    assert_eq!(result, Err(StoreError::ValueTooLarge));
    assert_eq!(attempts.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(get(db, ok).await, None);
    assert_eq!(get(db, big).await, None);
}

/// A closure that returns an error commits nothing, and a non-retryable
/// one is not retried.
pub async fn failed_closure_commits_nothing(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let db = &t.db;
    let k = &key(db, b"fail");
    let attempts = std::sync::atomic::AtomicU32::new(0);
    let attempts = &attempts;
    let result: Result<(), _> = run(&**db, TxOptions::write(), |tx| async move {
        attempts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tx.set(k, b"x");
        tx.atomic_add(k, 1);
        Err(StoreError::Invalid("closure says no".into()))
    })
    .await;
    assert_eq!(result, Err(StoreError::Invalid("closure says no".into())));
    assert_eq!(attempts.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(get(db, k).await, None);
    // A retryable error from the closure is retried, and the last attempt's
    // writes are the ones committed.
    let attempts = std::sync::atomic::AtomicU32::new(0);
    let attempts = &attempts;
    run(&**db, TxOptions::write(), |tx| async move {
        let n = attempts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tx.atomic_add(k, 1);
        if n < 2 {
            return Err(StoreError::Conflict);
        }
        Ok(())
    })
    .await
    .expect("third attempt commits");
    assert_eq!(le_i64(get(db, k).await), 1, "only the committed attempt's add counts");
}
