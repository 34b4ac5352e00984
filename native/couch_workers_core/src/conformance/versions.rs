//! Versionstamps and commit and read versions.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::helpers::{get, get_range, key, put, read_version, stamp_param, version_of, write};
use super::StoreFactory;
use crate::store::{run, run_attempts, Db, RangeRequest, StoreError, TxOptions};

/// Versionstamped keys and values: one stamp per commit, shared by every
/// versionstamped operation of it, equal to `CommitInfo.versionstamp`,
/// whose first 8 bytes are the commit version; later commits sort after.
pub async fn versionstamps(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let db = &t.db;
    let kp = key(db, b"vs/k/");
    let mut infos = Vec::new();
    for round in 0u8..3 {
        let kparam = stamp_param(&kp, &[b'/', round]);
        let vkey = key(db, &[b'v', b's', b'/', b'v', b'/', round]);
        let vparam = stamp_param(b"pre:", b":post");
        let info = write(db, |tx| {
            tx.set_versionstamped_key(&kparam, &[round]);
            tx.set_versionstamped_value(&vkey, &vparam);
        })
        .await;
        let stamp = info.versionstamp.expect("CommitInfo.versionstamp set");
        assert_eq!(Some(version_of(&stamp)), info.version, "stamp starts with the commit version");
        let value = get(db, &vkey).await.expect("stamped value");
        assert_eq!(value, [b"pre:".as_slice(), &stamp, b":post"].concat(), "value holds the commit's stamp");
        infos.push(stamp);
    }
    assert!(infos.windows(2).all(|w| w[0] < w[1]), "stamps increase with commits: {infos:02x?}");
    let keys = get_range(db, RangeRequest::prefix(&kp)).await;
    assert_eq!(keys.len(), 3);
    for (round, ((k, v), stamp)) in keys.iter().zip(&infos).enumerate() {
        assert_eq!(k, &[kp.as_slice(), stamp, &[b'/', round as u8]].concat(), "key holds the commit's stamp");
        assert_eq!(v, &vec![round as u8], "stamped keys sort in commit order");
    }
}

/// A transaction cannot read back what it wrote with a versionstamp
/// (FoundationDB's `accessed_unreadable`, 1036), snapshot or not: the key
/// of a versionstamped value (also after setting it again; a clear makes
/// it readable), and any key or range a versionstamped key may become.
/// Other keys, and keys stamped by earlier commits, stay readable; but a
/// refused read fails the transaction: its commit answers 1036, which is
/// not retryable, and nothing of it is written. (FoundationDB 7.1.67 does
/// exactly this; the suite's first version expected the commit to work.)
pub async fn reading_own_versionstamped_write_is_accessed_unreadable(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let db = &t.db;
    let (vkey, other, log) = (&key(db, b"unr/v"), &key(db, b"unr/other"), &key(db, b"unr/log/"));
    let earlier = write(db, |tx| tx.set_versionstamped_key(&stamp_param(log, b""), b"earlier")).await;
    let earlier_key = &[log.as_slice(), &earlier.versionstamp.expect("stamp")[..]].concat();
    // A later commit: the read version below is past the earlier stamp's
    // version (FDB's unreadable range starts at the read version).
    put(db, other, b"x").await;
    let kparam = &stamp_param(log, b"");
    let vparam = &stamp_param(b"", b"");
    let mut end = log.clone();
    end.push(0xff);
    let log_range = &RangeRequest::new(log.clone(), end);
    let code = |r: Result<(), StoreError>| match r {
        Err(StoreError::Fdb { code, .. }) => Some(code),
        _ => None,
    };
    let tx = db.create_transaction(&TxOptions::write()).await.expect("transaction");
    // A read version first: before one, FDB makes the whole range a
    // versionstamped key may take unreadable (it fills in 0).
    tx.read_version().await.expect("read version");
    tx.set(other, b"y");
    tx.set_versionstamped_value(vkey, vparam);
    tx.set_versionstamped_key(kparam, b"mine");
    let got = vec![
        code(tx.get(vkey, false).await.map(|_| ())),
        code(tx.get(vkey, true).await.map(|_| ())),
        code(tx.get_range(log_range).await.map(|_| ())),
    ];
    assert_eq!(got, vec![Some(1036), Some(1036), Some(1036)], "accessed_unreadable");
    let fine = (tx.get(other, false).await.expect("own set"), tx.get(earlier_key, false).await.expect("older stamp"));
    assert_eq!(fine, (Some(b"y".to_vec()), Some(b"earlier".to_vec())), "other keys stay readable");
    tx.set(vkey, b"plain");
    assert_eq!(code(tx.get(vkey, false).await.map(|_| ())), Some(1036), "set again: still unreadable");
    let commit = tx.commit().await.map(|_| ());
    assert_eq!(code(commit.clone()), Some(1036), "a refused read fails the commit: {commit:?}");
    assert!(!StoreError::accessed_unreadable().is_retryable());
    assert_eq!(get(db, other).await, Some(b"x".to_vec()), "nothing of it written");

    // A clear makes the key readable again, and then the commit works.
    let tx = db.create_transaction(&TxOptions::write()).await.expect("transaction");
    tx.read_version().await.expect("read version");
    tx.set_versionstamped_value(vkey, vparam);
    tx.clear(vkey);
    assert_eq!(tx.get(vkey, false).await.expect("cleared: readable"), None);
    tx.set(other, b"z");
    tx.commit().await.expect("no refused read: it commits");
    assert_eq!(get(db, other).await, Some(b"z".to_vec()));

    // Writing with a versionstamp and never reading it back commits.
    let info = write(db, |tx| {
        tx.set_versionstamped_value(vkey, vparam);
    })
    .await;
    assert_eq!(get(db, vkey).await, info.versionstamp.map(|s| s.to_vec()));
}

/// A versionstamp offset outside the parameter fails the transaction;
/// nothing of it is written.
pub async fn versionstamp_bad_offset_writes_nothing(s: &dyn StoreFactory) {
    let t = s.fresh().await;
    let db = &t.db;
    let good = &key(db, b"vsbad/good");
    let vkey = &key(db, b"vsbad/v");
    let mut bad = b"short".to_vec();
    bad.extend_from_slice(&100u32.to_le_bytes());
    let bad = &bad;
    let result = run(&**db, TxOptions::write(), |tx| async move {
        tx.set(good, b"x");
        tx.set_versionstamped_value(vkey, bad);
        Ok(())
    })
    .await;
    assert!(result.is_err(), "a bad versionstamp offset must fail the commit, got {result:?}");
    assert_eq!(get(db, good).await, None);
    assert_eq!(get(db, vkey).await, None);
}

/// Commit versions strictly increase across two handles, alternating and
/// concurrently.
pub async fn commit_versions_increase_across_handles(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let k = key(&a.db, b"cv");
    let mut last = 0u64;
    for i in 0u8..20 {
        let db = if i % 2 == 0 { &a.db } else { &b.db };
        let v = put(db, &k, &[i]).await.version.expect("version");
        assert!(v > last, "commit {i}: version {v} after {last}");
        last = v;
    }
    // A read version after a commit is at least the commit version.
    assert!(read_version(&b.db).await >= last);
    assert!(read_version(&a.db).await >= last);
    // Concurrently: every handle's sequence increases; no version repeats.
    let spawn = |db: Db, name: &'static [u8]| {
        let k = key(&db, name);
        tokio::spawn(async move {
            let mut versions = Vec::new();
            for i in 0u32..30 {
                let v = put(&db, &k, &i.to_be_bytes()).await.version.expect("version");
                versions.push(v);
            }
            versions
        })
    };
    let ha = spawn(a.db.clone(), b"cv/a");
    let hb = spawn(b.db.clone(), b"cv/b");
    let (va, vb) = (ha.await.expect("task a"), hb.await.expect("task b"));
    for v in [&va, &vb] {
        assert!(v.windows(2).all(|w| w[0] < w[1]), "per-handle versions increase: {v:?}");
        assert!(v[0] > last);
    }
    // No claim that the two handles' versions differ: FoundationDB commits
    // the transactions of one batch at one version (only versionstamps,
    // with their batch order, are unique; `versionstamps_unique_across_handles`).
}

/// Versionstamps of concurrent commits from two handles are all distinct
/// and each handle's are increasing.
pub async fn versionstamps_unique_across_handles(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let spawn = |db: Db, name: &'static [u8]| {
        let k = key(&db, name);
        tokio::spawn(async move {
            let mut stamps = Vec::new();
            for _ in 0u32..30 {
                let k = &k;
                let (_, info) = run_attempts(&*db, TxOptions::write(), |tx, _| async move {
                    tx.set_versionstamped_value(k, &stamp_param(b"", b""));
                    Ok(())
                })
                .await
                .expect("commit");
                stamps.push(info.versionstamp.expect("versionstamp"));
            }
            stamps
        })
    };
    let ha = spawn(a.db.clone(), b"vsu/a");
    let hb = spawn(b.db.clone(), b"vsu/b");
    let (sa, sb) = (ha.await.expect("task a"), hb.await.expect("task b"));
    for s in [&sa, &sb] {
        assert!(s.windows(2).all(|w| w[0] < w[1]), "per-handle versionstamps increase: {s:?}");
    }
    let all: BTreeSet<[u8; 10]> = sa.iter().chain(&sb).copied().collect();
    assert_eq!(all.len(), sa.len() + sb.len(), "no two commits share a versionstamp");
}

/// Versions rise with time at about one million per second: commit
/// versions 100 ms apart differ by about 100 000, and a read version is at
/// least the version of every commit before it.
///
/// Read versions themselves need not move with time: on FoundationDB they
/// are the last committed version and move only with commits (and the
/// idle cluster's empty batch every 2 s); `read_version_rises_without_commits`.
pub async fn versions_rise_about_one_million_per_second(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let k = key(&a.db, b"rate");
    // Bounds: at least half the rate over the sleep; at most twice the rate
    // over the whole measured span plus 200 ms of slack (a loaded machine
    // only makes the span longer, which the bound follows).
    let check = |delta: u64, span: Duration, what: &str| {
        assert!(delta >= 50_000, "{what}: versions advanced {delta} in >= 100 ms");
        let most = span.as_micros() as u64 * 2 + 200_000;
        assert!(delta <= most, "{what}: versions advanced {delta} in {span:?}");
    };
    let started = Instant::now();
    let c1 = put(&a.db, &k, b"1").await.version.expect("version");
    let r1 = read_version(&b.db).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let c2 = put(&b.db, &k, b"2").await.version.expect("version");
    let r2 = read_version(&a.db).await;
    check(c2 - c1, started.elapsed(), "commit version, two handles");
    assert!(r1 >= c1, "read version {r1} after the commit at {c1}");
    assert!(r2 >= c2, "read version {r2} after the commit at {c2}");
}

/// With no commit, a read version never goes back, and it does rise
/// within the idle cluster's empty-batch interval (FoundationDB's proxies
/// commit an empty batch every 2 s, `MAX_COMMIT_BATCH_INTERVAL`; the
/// embedded store's read versions follow its clock), on every handle
/// alike. Liveness code may rely on that much and no more.
pub async fn read_version_rises_without_commits(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let r1 = read_version(&a.db).await;
    let started = Instant::now();
    let mut last = r1;
    let mut on_a = false;
    let rose = loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        on_a = !on_a;
        let db = if on_a { &a.db } else { &b.db };
        let r = read_version(db).await;
        assert!(r >= last, "read version went back from {last} to {r} with no commit");
        last = r;
        if r > r1 {
            break started.elapsed();
        }
        assert!(started.elapsed() < Duration::from_secs(3), "read version stood at {r1} for 3 s with no commit");
    };
    assert!(rose < Duration::from_millis(2_500), "read version rose only after {rose:?}");
    // A transaction's read version does not change while it lives.
    let tx = a.db.create_transaction(&TxOptions::read()).await.expect("transaction");
    let v1 = tx.read_version().await.expect("read version");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(tx.read_version().await.expect("read version"), v1);
}
