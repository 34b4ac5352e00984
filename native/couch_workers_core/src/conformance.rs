//! The store conformance suite: one set of behaviours, run against every
//! store (the embedded and `sim` stores always; FoundationDB when
//! `FDB_CLUSTER_FILE` is set), so that key-space code written against
//! [`crate::store`] means the same thing everywhere.
//!
//! Test code: compiled only with the crate's `testkit` feature, which the
//! crate's own tests turn on (its dev-dependency on itself) and nothing
//! shipped does (`scripts/check-no-testkit.sh` checks the built NIF).
//!
//! # How a store plugs in
//!
//! A store under test provides two async functions:
//!
//! ```text
//! /// A fresh, empty, isolated store. `guard` keeps whatever backs it alive
//! /// (a temp dir; an FDB test directory, removed on drop).
//! async fn open_fresh() -> TestDb;
//! /// A second, independent handle on the SAME store as `first` (its own
//! /// connections, threads and watches: as another Erlang node would
//! /// open it). Its `guard` may be `Box::new(())`: `first` outlives it.
//! async fn open_second(first: &TestDb) -> TestDb;
//! ```
//!
//! and expands the suite into one `#[tokio::test(flavor = "multi_thread")]`
//! per behaviour:
//!
//! ```text
//! couch_workers_core::store_conformance_tests!(open_fresh, open_second);
//! // or, with attributes put on every generated test:
//! couch_workers_core::store_conformance_tests!(open_fresh, open_second, attrs: #[ignore = "needs FDB"]);
//! ```
//!
//! The generated tests need `tokio` (with `macros` and `rt-multi-thread`)
//! among the test crate's dependencies. A store that is not always there
//! (FoundationDB) should not make its tests pass without asserting
//! anything: put them behind `attrs: #[ignore = "..."]` and run them with
//! `-- --ignored` where the store exists (and/or gate the file on a cargo
//! feature), so that a machine without it shows them as ignored, not
//! passed.
//!
//! `open_second` finds the store of `first` through `first.guard` (downcast
//! it to the guard type your `open_fresh` put there) or through
//! `first.db.prefix()`.
//!
//! Rules the suite keeps, and the store must allow:
//!
//! * every key it touches starts with `db.prefix()` (FDB: the test
//!   directory's prefix), followed by `b"cwconf/"`; a fresh store may be
//!   assumed empty under it;
//! * [`close_fails_pending_watches`] calls `close()` on a handle from
//!   `open_second` and then keeps using the first handle: `close` must end
//!   only its own handle;
//! * every test takes well under 3 s on an idle machine (one waits for an
//!   idle FoundationDB's empty commit batch, up to 2 s).
//!
//! Each behaviour is a `pub async fn(&dyn StoreFactory)`, callable on its
//! own. A test that asserts nothing is never counted as passed: each one
//! checks an outcome.

use std::any::Any;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

pub use futures::future::BoxFuture;

use crate::store::{
    run, run_with_info, CommitInfo, Db, RangeRequest, StoreError, Tx, TxOptions, Versionstamp, MAX_KEY_SIZE,
    MAX_TRANSACTION_SIZE, MAX_VALUE_SIZE, VERSIONSTAMP_LEN,
};

/// A store handle under test.
pub struct TestDb {
    pub db: Db,
    /// Keeps the store's backing alive while the test runs (a temp dir; an
    /// FDB test directory that is removed on drop).
    pub guard: Box<dyn Any + Send + Sync>,
}

/// How the suite opens stores. [`store_conformance_tests!`] implements it
/// from two async functions; implement it by hand for anything fancier.
pub trait StoreFactory: Send + Sync {
    /// A fresh, empty, isolated store.
    fn fresh(&self) -> BoxFuture<'_, TestDb>;
    /// A second independent handle on the same store as `first`.
    fn second<'a>(&'a self, first: &'a TestDb) -> BoxFuture<'a, TestDb>;
}

/// One `#[tokio::test]` per behaviour name, each calling
/// `$crate::$module::$name(&$store)` with the caller's attributes. Shared
/// by this suite's macro and `keyspace_conformance_tests!`.
#[doc(hidden)]
#[macro_export]
macro_rules! __cw_conformance_cases {
    ($module:ident, $store:ident, [$($attrs:tt)*]) => {};
    ($module:ident, $store:ident, [$($attrs:tt)*] $name:ident $(, $rest:ident)* $(,)?) => {
        $($attrs)*
        #[::tokio::test(flavor = "multi_thread")]
        async fn $name() {
            $crate::$module::$name(&$store).await;
        }
        $crate::__cw_conformance_cases!($module, $store, [$($attrs)*] $($rest),*);
    };
}

/// A [`StoreFactory`] named `$store` from the two opening functions.
#[doc(hidden)]
#[macro_export]
macro_rules! __cw_conformance_store {
    ($store:ident, $open_fresh:expr, $open_second:expr) => {
        struct $store;

        impl $crate::conformance::StoreFactory for $store {
            fn fresh(&self) -> $crate::conformance::BoxFuture<'_, $crate::conformance::TestDb> {
                ::std::boxed::Box::pin(($open_fresh)())
            }
            fn second<'a>(
                &'a self,
                first: &'a $crate::conformance::TestDb,
            ) -> $crate::conformance::BoxFuture<'a, $crate::conformance::TestDb> {
                ::std::boxed::Box::pin(($open_second)(first))
            }
        }
    };
}

/// Expands the conformance suite into one tokio test per behaviour. See
/// the [module doc](crate::conformance).
#[macro_export]
macro_rules! store_conformance_tests {
    ($open_fresh:expr, $open_second:expr) => {
        $crate::store_conformance_tests!($open_fresh, $open_second, attrs:);
    };
    ($open_fresh:expr, $open_second:expr, attrs: $(#[$attr:meta])*) => {
        $crate::__cw_conformance_store!(__CwConformanceStore, $open_fresh, $open_second);

        $crate::__cw_conformance_cases!(conformance, __CwConformanceStore, [$(#[$attr])*]
            read_your_writes,
            get_missing_key,
            set_clear_clear_range,
            range_reads,
            read_only_commit_has_no_version,
            read_hint_transaction_may_write,
            versionstamps,
            versionstamp_bad_offset_writes_nothing,
            reading_own_versionstamped_write_is_accessed_unreadable,
            commit_versions_increase_across_handles,
            versionstamps_unique_across_handles,
            versions_rise_about_one_million_per_second,
            read_version_rises_without_commits,
            atomic_add,
            atomic_add_concurrent_handles,
            atomic_add_in_order_with_its_transaction,
            atomic_byte_max,
            serializable_increments,
            serializable_increments_read_hint,
            retry_limit_on_persistent_conflict,
            retry_timeout_on_persistent_conflict,
            non_retryable_store_error_returned_at_once,
            failed_closure_commits_nothing,
            key_too_large,
            value_too_large,
            versionstamped_sizes_count_the_offset,
            transaction_too_large,
            watch_fires_on_own_change,
            watch_fires_on_other_handle_change,
            dropped_watch_is_harmless,
            watch_of_uncommitted_transaction_fails,
            close_fails_pending_watches,
        );
    };
}

// ---- helpers -----------------------------------------------------------

/// `prefix ++ "cwconf/" ++ name`: every key of the suite.
fn key(db: &Db, name: &[u8]) -> Vec<u8> {
    let mut k = db.prefix();
    k.extend_from_slice(b"cwconf/");
    k.extend_from_slice(name);
    k
}

/// Runs `f` (writes only) in [`run_with_info`]; returns the commit's
/// [`CommitInfo`].
async fn write(db: &Db, f: impl Fn(&Tx)) -> CommitInfo {
    let f = &f;
    let ((), info) = run_with_info(&**db, TxOptions::write(), |tx| async move {
        f(&tx);
        Ok(())
    })
    .await
    .expect("write transaction commits");
    info
}

async fn put(db: &Db, k: &[u8], v: &[u8]) -> CommitInfo {
    write(db, |tx| tx.set(k, v)).await
}

async fn get(db: &Db, k: &[u8]) -> Option<Vec<u8>> {
    run(&**db, TxOptions::read(), |tx| async move { tx.get(k, false).await }).await.expect("read")
}

async fn get_range(db: &Db, range: RangeRequest) -> Vec<(Vec<u8>, Vec<u8>)> {
    let range = &range;
    run(&**db, TxOptions::read(), |tx| async move { tx.get_range(range).await }).await.expect("range read")
}

async fn read_version(db: &Db) -> u64 {
    run(&**db, TxOptions::read(), |tx| async move { tx.read_version().await }).await.expect("read version")
}

fn le_i64(v: Option<Vec<u8>>) -> i64 {
    let v = v.expect("counter present");
    i64::from_le_bytes(v.as_slice().try_into().expect("8-byte counter"))
}

/// A versionstamp parameter: `before ++ placeholder ++ after ++ offset`.
fn stamp_param(before: &[u8], after: &[u8]) -> Vec<u8> {
    let mut p = before.to_vec();
    p.extend_from_slice(&[0xff; VERSIONSTAMP_LEN]);
    p.extend_from_slice(after);
    p.extend_from_slice(&(before.len() as u32).to_le_bytes());
    p
}

fn version_of(stamp: &Versionstamp) -> u64 {
    let mut be = [0u8; 8];
    be.copy_from_slice(&stamp[..8]);
    u64::from_be_bytes(be)
}

/// Awaits a watch for at most `limit`.
async fn wait_watch(watch: crate::store::Watch, limit: Duration) -> Option<Result<(), StoreError>> {
    tokio::time::timeout(limit, watch).await.ok()
}

// ---- basics ------------------------------------------------------------

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

// ---- versionstamps and versions ----------------------------------------

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
/// of a versionstamped value until it is set again, and any key or range a
/// versionstamped key may become. Other keys, and keys stamped by earlier
/// commits, stay readable; the transaction still commits.
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
    let codes = run(&**db, TxOptions::write(), |tx| async move {
        let code = |r: Result<_, StoreError>| match r {
            Err(StoreError::Fdb { code, .. }) => Some(code),
            _ => None,
        };
        // A read version first: before one, FDB makes the whole range a
        // versionstamped key may take unreadable (it fills in 0).
        tx.read_version().await?;
        tx.set(other, b"x");
        tx.set_versionstamped_value(vkey, vparam);
        tx.set_versionstamped_key(kparam, b"mine");
        let got = vec![
            code(tx.get(vkey, false).await.map(|_| ())),
            code(tx.get(vkey, true).await.map(|_| ())),
            code(tx.get_range(log_range).await.map(|_| ())),
        ];
        let fine = (tx.get(other, false).await?, tx.get(earlier_key, false).await?);
        tx.set(vkey, b"plain");
        let after_set = tx.get(vkey, false).await?;
        Ok((got, fine, after_set))
    })
    .await
    .expect("the transaction still commits");
    assert_eq!(codes.0, vec![Some(1036), Some(1036), Some(1036)], "accessed_unreadable");
    assert_eq!(codes.1, (Some(b"x".to_vec()), Some(b"earlier".to_vec())));
    assert_eq!(codes.2, Some(b"plain".to_vec()), "set again: readable");
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
                let (_, info) = run_with_info(&*db, TxOptions::write(), |tx| async move {
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

// ---- atomic add --------------------------------------------------------

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
    assert!(tokio::time::timeout(Duration::from_millis(300), &mut w).await.is_err(), "fired on its own transaction's add");
    write(db, |tx| tx.atomic_add(b, 1)).await;
    assert_eq!(tokio::time::timeout(Duration::from_secs(10), &mut w).await, Ok(Ok(())));
    assert_eq!(le_i64(get(db, b).await), -1);
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

// ---- serializability and the retry loop --------------------------------

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

// ---- limits ------------------------------------------------------------

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

// ---- watches -----------------------------------------------------------

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
