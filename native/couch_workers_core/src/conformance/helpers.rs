//! What every behaviour of the suite uses: its keys, one-line reads and
//! writes, versionstamp arithmetic.

use std::time::Duration;

use crate::store::{
    run, run_attempts, CommitInfo, Db, RangeRequest, StoreError, Tx, TxOptions, Versionstamp, VERSIONSTAMP_LEN,
};

/// `prefix ++ "cwconf/" ++ name`: every key of the suite.
pub(super) fn key(db: &Db, name: &[u8]) -> Vec<u8> {
    let mut k = db.prefix();
    k.extend_from_slice(b"cwconf/");
    k.extend_from_slice(name);
    k
}

/// Runs `f` (writes only) in [`run_attempts`]; returns the commit's
/// [`CommitInfo`].
pub(super) async fn write(db: &Db, f: impl Fn(&Tx)) -> CommitInfo {
    let f = &f;
    let ((), info) = run_attempts(&**db, TxOptions::write(), |tx, _| async move {
        f(&tx);
        Ok(())
    })
    .await
    .expect("write transaction commits");
    info
}

pub(super) async fn put(db: &Db, k: &[u8], v: &[u8]) -> CommitInfo {
    write(db, |tx| tx.set(k, v)).await
}

pub(super) async fn get(db: &Db, k: &[u8]) -> Option<Vec<u8>> {
    run(&**db, TxOptions::read(), |tx| async move { tx.get(k, false).await }).await.expect("read")
}

pub(super) async fn get_range(db: &Db, range: RangeRequest) -> Vec<(Vec<u8>, Vec<u8>)> {
    let range = &range;
    run(&**db, TxOptions::read(), |tx| async move { tx.get_range(range).await }).await.expect("range read")
}

pub(super) async fn read_version(db: &Db) -> u64 {
    run(&**db, TxOptions::read(), |tx| async move { tx.read_version().await }).await.expect("read version")
}

pub(super) fn le_i64(v: Option<Vec<u8>>) -> i64 {
    let v = v.expect("counter present");
    i64::from_le_bytes(v.as_slice().try_into().expect("8-byte counter"))
}

/// A versionstamp parameter: `before ++ placeholder ++ after ++ offset`.
pub(super) fn stamp_param(before: &[u8], after: &[u8]) -> Vec<u8> {
    let mut p = before.to_vec();
    p.extend_from_slice(&[0xff; VERSIONSTAMP_LEN]);
    p.extend_from_slice(after);
    p.extend_from_slice(&(before.len() as u32).to_le_bytes());
    p
}

pub(super) fn version_of(stamp: &Versionstamp) -> u64 {
    let mut be = [0u8; 8];
    be.copy_from_slice(&stamp[..8]);
    u64::from_be_bytes(be)
}

/// Awaits a watch for at most `limit`.
pub(super) async fn wait_watch(watch: crate::store::Watch, limit: Duration) -> Option<Result<(), StoreError>> {
    tokio::time::timeout(limit, watch).await.ok()
}
