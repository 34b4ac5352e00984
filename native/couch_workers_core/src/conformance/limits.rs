//! Key, value and transaction size limits.

use super::helpers::{get, get_range, key, put, stamp_param, write};
use super::StoreFactory;
use crate::store::{
    run, RangeRequest, StoreError, TxOptions, MAX_KEY_SIZE, MAX_TRANSACTION_SIZE, MAX_VALUE_SIZE, VERSIONSTAMP_LEN,
};

/// A key of exactly `MAX_KEY_SIZE` bytes is stored; one byte more fails
/// with `KeyTooLarge` and nothing is written.
pub async fn key_too_large(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let db = &t.db;
    let base = key(db, b"klim/");
    let sized = |n: usize| {
        let mut k = base.clone();
        k.resize(n, b'k');
        k
    };
    let (fits, over) = (&sized(MAX_KEY_SIZE), &sized(MAX_KEY_SIZE + 1));
    put(db, fits, b"ok").await;
    assert_eq!(get(db, fits).await, Some(b"ok".to_vec()));
    let other = &key(db, b"klim-other");
    let result = run(&**db, TxOptions::write(), |tx| async move {
        tx.set(other, b"x");
        tx.set(over, b"too big");
        Ok(())
    })
    .await;
    assert_eq!(result, Err(StoreError::KeyTooLarge));
    assert_eq!(get(db, other).await, None);
}

/// A value of exactly `MAX_VALUE_SIZE` bytes is stored; one byte more fails
/// with `ValueTooLarge` and nothing is written.
pub async fn value_too_large(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let db = &t.db;
    let (fits, over) = (&key(db, b"vlim/fits"), &key(db, b"vlim/over"));
    let value = vec![1u8; MAX_VALUE_SIZE];
    put(db, fits, &value).await;
    assert_eq!(get(db, fits).await.map(|v| v.len()), Some(MAX_VALUE_SIZE));
    let big = &vec![2u8; MAX_VALUE_SIZE + 1];
    let result = run(&**db, TxOptions::write(), |tx| async move {
        tx.clear(fits);
        tx.set(over, big);
        Ok(())
    })
    .await;
    assert_eq!(result, Err(StoreError::ValueTooLarge));
    assert_eq!(get(db, fits).await.map(|v| v.len()), Some(MAX_VALUE_SIZE), "the clear was not committed");
    assert_eq!(get(db, over).await, None);
}

/// FoundationDB checks a versionstamped key or value with its 4-byte
/// offset (the parameter as given), not the stored bytes: a parameter of
/// `MAX_VALUE_SIZE` (`MAX_KEY_SIZE`) bytes is stored, one byte more fails
/// although what would be stored (4 bytes less) is under the limit.
pub async fn versionstamped_sizes_count_the_offset(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let db = &t.db;
    let (fits, over) = (&key(db, b"vslim/fits"), &key(db, b"vslim/over"));
    let param = |len: usize| stamp_param(&vec![3u8; len - VERSIONSTAMP_LEN - 4], b"");
    let (fit_param, over_param) = (&param(MAX_VALUE_SIZE), &param(MAX_VALUE_SIZE + 1));
    write(db, |tx| tx.set_versionstamped_value(fits, fit_param)).await;
    assert_eq!(get(db, fits).await.map(|v| v.len()), Some(MAX_VALUE_SIZE - 4));
    let result = run(&**db, TxOptions::write(), |tx| async move {
        tx.set_versionstamped_value(over, over_param);
        Ok(())
    })
    .await;
    assert_eq!(result, Err(StoreError::ValueTooLarge), "a 99,997-byte stored value with its offset is over");
    assert_eq!(get(db, over).await, None);
    // Same for keys.
    let base = key(db, b"vslim/k/");
    let key_param = |len: usize| stamp_param(&base, &vec![b'k'; len - base.len() - VERSIONSTAMP_LEN - 4]);
    let (fit_key, over_key) = (&key_param(MAX_KEY_SIZE), &key_param(MAX_KEY_SIZE + 1));
    write(db, |tx| tx.set_versionstamped_key(fit_key, b"ok")).await;
    let result = run(&**db, TxOptions::write(), |tx| async move {
        tx.set_versionstamped_key(over_key, b"over");
        Ok(())
    })
    .await;
    assert_eq!(result, Err(StoreError::KeyTooLarge), "a key param of MAX_KEY_SIZE + 1 bytes with its offset is over");
    let mut end = base.clone();
    end.push(0xff);
    let stored = get_range(db, RangeRequest::new(base.clone(), end)).await;
    assert_eq!(stored.iter().map(|(k, _)| k.len()).collect::<Vec<_>>(), vec![MAX_KEY_SIZE - 4]);
}

/// Writes over `MAX_TRANSACTION_SIZE` fail with `TransactionTooLarge` and
/// nothing is written.
pub async fn transaction_too_large(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let db = &t.db;
    let value = &vec![3u8; MAX_VALUE_SIZE];
    let n = MAX_TRANSACTION_SIZE / MAX_VALUE_SIZE + 1;
    let first = &key(db, b"tlim/0000");
    let result = run(&**db, TxOptions::write(), |tx| async move {
        for i in 0..n {
            tx.set(&key(db, format!("tlim/{i:04}").as_bytes()), value);
        }
        Ok(())
    })
    .await;
    assert_eq!(result, Err(StoreError::TransactionTooLarge));
    assert_eq!(get(db, first).await, None);
    assert!(get_range(db, RangeRequest::prefix(&key(db, b"tlim/"))).await.is_empty());
}
