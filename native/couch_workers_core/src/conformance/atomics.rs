//! Atomic operations: ADD and BYTE_MAX.

use super::StoreFactory;
use std::time::Duration;

use super::helpers::{get, key, le_i64, put, write};
use crate::store::{run, RangeRequest, TxOptions};

/// FDB's ADD: missing = 0, negative deltas, wrapping, 8-byte LE results.
pub async fn atomic_add(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let db = &t.db;
    let k = &key(db, b"add");
    write(db, |tx| tx.atomic_add(k, 5)).await;
    assert_eq!(get(db, k).await, Some(5i64.to_le_bytes().to_vec()));
    write(db, |tx| tx.atomic_add(k, -12)).await;
    assert_eq!(le_i64(get(db, k).await), -7);
    write(db, |tx| {
        tx.atomic_add(k, 3);
        tx.atomic_add(k, 4);
    })
    .await;
    assert_eq!(le_i64(get(db, k).await), 0);
    put(db, k, &i64::MAX.to_le_bytes()).await;
    write(db, |tx| tx.atomic_add(k, 1)).await;
    assert_eq!(le_i64(get(db, k).await), i64::MIN, "wraps");
    write(db, |tx| tx.atomic_add(k, -1)).await;
    assert_eq!(le_i64(get(db, k).await), i64::MAX, "wraps back");
    // A stored value of another length: a shorter one is read padded with
    // zeros, a longer one cut to the operand's 8 bytes.
    put(db, k, &[1]).await;
    write(db, |tx| tx.atomic_add(k, 1)).await;
    assert_eq!(get(db, k).await, Some(2i64.to_le_bytes().to_vec()), "short value");
    put(db, k, &[1, 0, 0, 0, 0, 0, 0, 0, 9, 9]).await;
    write(db, |tx| tx.atomic_add(k, 1)).await;
    assert_eq!(get(db, k).await, Some(2i64.to_le_bytes().to_vec()), "long value");
    put(db, k, &[]).await;
    write(db, |tx| tx.atomic_add(k, 3)).await;
    assert_eq!(get(db, k).await, Some(3i64.to_le_bytes().to_vec()), "empty value");
}

/// BYTE_MAX: a missing key gets the operand, a smaller operand leaves the
/// stored value, a larger one replaces it (lexicographic order), from any
/// handle; the transaction reads its own result.
pub async fn atomic_byte_max(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let db = &t.db;
    let k = &key(db, b"bytemax");
    write(db, |tx| tx.atomic_byte_max(k, &5u64.to_be_bytes())).await;
    assert_eq!(get(db, k).await, Some(5u64.to_be_bytes().to_vec()), "missing key: the operand");
    write(db, |tx| tx.atomic_byte_max(k, &3u64.to_be_bytes())).await;
    assert_eq!(get(db, k).await, Some(5u64.to_be_bytes().to_vec()), "smaller operand: unchanged");
    write(db, |tx| tx.atomic_byte_max(k, &9u64.to_be_bytes())).await;
    assert_eq!(get(db, k).await, Some(9u64.to_be_bytes().to_vec()), "larger operand: replaces");
    let seen = run(&**db, TxOptions::write(), |tx| async move {
        tx.atomic_byte_max(k, &7u64.to_be_bytes());
        tx.atomic_byte_max(k, &12u64.to_be_bytes());
        tx.get(k, false).await
    })
    .await
    .expect("commit");
    assert_eq!(seen, Some(12u64.to_be_bytes().to_vec()), "reads its own BYTE_MAX over the stored value");
    // Another handle's smaller operand leaves it too.
    let other = s.second(&t).await;
    write(&other.db, |tx| tx.atomic_byte_max(k, &10u64.to_be_bytes())).await;
    assert_eq!(get(db, k).await, Some(12u64.to_be_bytes().to_vec()));
}

/// Concurrent adds from two handles (and two tasks each) sum exactly.
pub async fn atomic_add_concurrent_handles(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let k = key(&a.db, b"addc");
    let mut tasks = Vec::new();
    let deltas = [1i64, 1, -2, 3];
    for (db, delta) in [a.db.clone(), b.db.clone(), a.db.clone(), b.db.clone()].into_iter().zip(deltas) {
        let k = k.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..25 {
                write(&db, |tx| tx.atomic_add(&k, delta)).await;
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(le_i64(get(&a.db, &k).await), 25 * deltas.iter().sum::<i64>());
}

/// Adds in order with the other operations of their transaction (the
/// embedded store holds a writer's adds until needed): reads, ranges and
/// watches see them; a later set, clear or range clear replaces them; an
/// add after a set or clear starts from it; other keys' writes between
/// two adds change nothing.
pub async fn atomic_add_in_order_with_its_transaction(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let db = &t.db;
    let (a, b, c) = (&key(db, b"ord/a"), &key(db, b"ord/b"), &key(db, b"ord/c"));
    let (begin, end) = (key(db, b"ord/"), key(db, b"ord0"));
    let (begin, end) = (&begin, &end);
    put(db, a, &10i64.to_le_bytes()).await;
    let seen = run(&**db, TxOptions::write(), |tx| async move {
        tx.atomic_add(a, 1);
        tx.set(c, b"x");
        tx.atomic_add(a, 2);
        let one = tx.get(a, false).await?;
        tx.atomic_add(a, 4);
        tx.atomic_add(b, 5);
        let range = tx.get_range(&RangeRequest::new(begin.clone(), end.clone())).await?;
        Ok((one, range))
    })
    .await
    .expect("commit");
    assert_eq!(le_i64(seen.0), 13, "a read sees the adds before it");
    let in_range: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (a.clone(), 17i64.to_le_bytes().to_vec()),
        (b.clone(), 5i64.to_le_bytes().to_vec()),
        (c.clone(), b"x".to_vec()),
    ];
    assert_eq!(seen.1, in_range, "a range read sees them, also on a key that did not exist");
    assert_eq!(le_i64(get(db, a).await), 17);
    write(db, |tx| {
        tx.atomic_add(a, 100);
        tx.set(a, &1i64.to_le_bytes());
        tx.atomic_add(a, 2);
        tx.atomic_add(b, 100);
        tx.clear(b);
        tx.atomic_add(c, 7);
        tx.clear_range(c, end);
    })
    .await;
    assert_eq!(le_i64(get(db, a).await), 3, "add, set, add: the set and the add after it");
    assert_eq!(get(db, b).await, None, "add then clear: cleared");
    assert_eq!(get(db, c).await, None, "add then a range clear: cleared");
    write(db, |tx| {
        tx.clear(b);
        tx.atomic_add(b, -3);
    })
    .await;
    assert_eq!(le_i64(get(db, b).await), -3, "clear then add: from zero");
    // A watch set in the transaction is set on the value with its adds:
    // only a later change fires it.
    let mut w = run(&**db, TxOptions::write(), |tx| async move {
        tx.atomic_add(b, 1);
        Ok(tx.watch(b))
    })
    .await
    .expect("watch");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut w).await.is_err(),
        "fired on its own transaction's add"
    );
    write(db, |tx| tx.atomic_add(b, 1)).await;
    assert_eq!(tokio::time::timeout(Duration::from_secs(10), &mut w).await, Ok(Ok(())));
    assert_eq!(le_i64(get(db, b).await), -1);
}
