//! Reads, writes, clears and ranges; read-only commits.

use super::helpers::{get, get_range, key, le_i64, put, write};
use super::StoreFactory;
use crate::store::{run, CommitInfo, RangeRequest, TxOptions};

/// Reads see the transaction's own sets, clears, range clears and adds.
pub async fn read_your_writes(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let db = &t.db;
    let (a, b, c, n) = (&key(db, b"ryw/a"), &key(db, b"ryw/b"), &key(db, b"ryw/c"), &key(db, b"ryw/n"));
    let (rb, re) = (&key(db, b"ryw/"), &key(db, b"ryw0"));
    put(db, a, b"old").await;
    run(&**db, TxOptions::write(), |tx| async move {
        assert_eq!(tx.get(a, false).await?, Some(b"old".to_vec()));
        tx.set(a, b"new");
        assert_eq!(tx.get(a, false).await?, Some(b"new".to_vec()));
        assert_eq!(tx.get(a, true).await?, Some(b"new".to_vec()));
        tx.clear(a);
        assert_eq!(tx.get(a, false).await?, None);
        tx.set(b, b"2");
        tx.set(c, b"3");
        let all = tx.get_range(&RangeRequest::new(rb.clone(), re.clone())).await?;
        assert_eq!(all, vec![(b.clone(), b"2".to_vec()), (c.clone(), b"3".to_vec())]);
        tx.clear_range(b, c);
        let all = tx.get_range(&RangeRequest::new(rb.clone(), re.clone())).await?;
        assert_eq!(all, vec![(c.clone(), b"3".to_vec())]);
        tx.atomic_add(n, 7);
        assert_eq!(tx.get(n, false).await?, Some(7i64.to_le_bytes().to_vec()));
        Ok(())
    })
    .await
    .expect("transaction");
    assert_eq!(get(db, a).await, None);
    assert_eq!(get(db, b).await, None);
    assert_eq!(get(db, c).await, Some(b"3".to_vec()));
    assert_eq!(le_i64(get(db, n).await), 7);
}

/// A key never written reads as `None`, also next to existing keys.
pub async fn get_missing_key(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let db = &t.db;
    assert_eq!(get(db, &key(db, b"missing")).await, None);
    put(db, &key(db, b"missing1"), b"x").await;
    assert_eq!(get(db, &key(db, b"missing")).await, None);
    assert_eq!(get(db, &key(db, b"missing0")).await, None);
    assert_eq!(get(db, &key(db, b"missing1")).await, Some(b"x".to_vec()));
    // The empty value is a value, not a missing key.
    put(db, &key(db, b"empty"), b"").await;
    assert_eq!(get(db, &key(db, b"empty")).await, Some(Vec::new()));
}

/// set overwrites, clear removes one key, clear_range removes `[begin, end)`.
pub async fn set_clear_clear_range(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let db = &t.db;
    let k = |i: u8| key(db, &[b'c', b'/', i]);
    let keys: Vec<Vec<u8>> = (0..6).map(k).collect();
    write(db, |tx| keys.iter().for_each(|key| tx.set(key, b"v1"))).await;
    put(db, &keys[0], b"v2").await;
    assert_eq!(get(db, &keys[0]).await, Some(b"v2".to_vec()));
    write(db, |tx| tx.clear(&keys[1])).await;
    assert_eq!(get(db, &keys[1]).await, None);
    // Clearing a missing key is fine.
    write(db, |tx| tx.clear(&key(db, b"c/none"))).await;
    write(db, |tx| tx.clear_range(&keys[2], &keys[4])).await;
    let left = get_range(db, RangeRequest::prefix(&key(db, b"c/"))).await;
    let left: Vec<_> = left.into_iter().map(|(k, _)| k).collect();
    assert_eq!(left, vec![keys[0].clone(), keys[4].clone(), keys[5].clone()]);
    // An empty range clears nothing.
    write(db, |tx| tx.clear_range(&keys[5], &keys[5])).await;
    assert_eq!(get(db, &keys[5]).await, Some(b"v1".to_vec()));
}

/// Range reads: order, limit, reverse, limit + reverse, empty and prefix
/// ranges, snapshot reads.
pub async fn range_reads(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let db = &t.db;
    let names: Vec<u8> = (b'a'..=b'j').collect();
    let k = |c: u8| key(db, &[b'r', b'/', c]);
    // Neighbours that must never show up.
    let outside = [key(db, b"r"), key(db, b"r0"), key(db, b"q/z"), key(db, b"r/")];
    write(db, |tx| {
        // Written in scrambled order.
        for &c in names.iter().rev() {
            tx.set(&k(c), &[c]);
        }
        for o in &outside {
            tx.set(o, b"out");
        }
        // A key that extends another sorts right after it.
        tx.set(&key(db, b"r/a\x00"), b"a0");
    })
    .await;
    let expect: Vec<(Vec<u8>, Vec<u8>)> = {
        let mut v: Vec<_> = names.iter().map(|&c| (k(c), vec![c])).collect();
        v.insert(1, (key(db, b"r/a\x00"), b"a0".to_vec()));
        v
    };
    let (begin, end) = (k(b'a'), key(db, b"r0"));
    let all = get_range(db, RangeRequest::new(begin.clone(), end.clone())).await;
    assert_eq!(all, expect);
    let first3 = get_range(db, RangeRequest::new(begin.clone(), end.clone()).limit(3)).await;
    assert_eq!(first3, expect[..3].to_vec());
    let rev = get_range(db, RangeRequest::new(begin.clone(), end.clone()).reverse(true)).await;
    assert_eq!(rev, expect.iter().rev().cloned().collect::<Vec<_>>());
    let last3 = get_range(db, RangeRequest::new(begin.clone(), end.clone()).limit(3).reverse(true)).await;
    assert_eq!(last3, expect.iter().rev().take(3).cloned().collect::<Vec<_>>());
    let big_limit = get_range(db, RangeRequest::new(begin.clone(), end.clone()).limit(1000)).await;
    assert_eq!(big_limit, expect);
    let snap = get_range(db, RangeRequest::new(begin.clone(), end.clone()).snapshot(true)).await;
    assert_eq!(snap, expect);
    // Half-open: begin included, end excluded.
    let mid = get_range(db, RangeRequest::new(k(b'c'), k(b'f'))).await;
    assert_eq!(mid.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(), vec![k(b'c'), k(b'd'), k(b'e')]);
    // Empty ranges.
    assert!(get_range(db, RangeRequest::new(k(b'c'), k(b'c'))).await.is_empty());
    assert!(get_range(db, RangeRequest::new(key(db, b"s/"), key(db, b"s0"))).await.is_empty());
    // Prefix range: every key starting with "r/" and nothing else.
    let pre = get_range(db, RangeRequest::prefix(&key(db, b"r/"))).await;
    assert_eq!(pre.len(), expect.len() + 1, "the bare prefix key r/ is in its own prefix range");
    assert_eq!(pre[0].0, key(db, b"r/"));
    assert_eq!(pre[1..].to_vec(), expect);
}

/// A transaction that writes nothing commits without a version.
pub async fn read_only_commit_has_no_version(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let db = &t.db;
    for opts in [TxOptions::read(), TxOptions::write()] {
        let tx = db.create_transaction(&opts).await.expect("transaction");
        assert_eq!(tx.get(&key(db, b"ro"), false).await, Ok(None));
        let info = tx.commit().await.expect("commit");
        assert_eq!(info, CommitInfo { version: None, versionstamp: None });
    }
    let info = put(db, &key(db, b"ro"), b"x").await;
    assert!(info.version.is_some());
    assert_eq!(info.versionstamp, None);
}

/// `TxOptions.writes` is a hint: a read-mode transaction may still write.
pub async fn read_hint_transaction_may_write(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let db = &t.db;
    let k = &key(db, b"hint");
    run(&**db, TxOptions::read(), |tx| async move {
        let v = tx.get(k, false).await?;
        assert_eq!(v, None);
        tx.set(k, b"written");
        Ok(())
    })
    .await
    .expect("read-mode transaction that writes");
    assert_eq!(get(db, k).await, Some(b"written".to_vec()));
}
