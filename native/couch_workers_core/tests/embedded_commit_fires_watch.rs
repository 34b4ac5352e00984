//! A local commit that changes a watched key fires the handle's watches
//! of it itself (`store/embedded/watch.rs`, `KeyChange`): no wake-up of
//! the watcher thread and no read of its own on the path of a local
//! wake-up (a `job_add` waking its node's dispatcher). The thread still
//! fires what the commit cannot judge: a watch that expects a value
//! another writer left, and a key the transaction had touched before the
//! watch existed or added to before it wrote it.
//!
//! Who fired is read from the watcher's trace (`watch_trace`), which
//! only the thread's fires update. Every handle's safety look is an hour
//! away, so a fire left to it would be a clear failure.

use std::time::Duration;

use couch_workers_core::store::embedded::EmbeddedStore;
use couch_workers_core::store::{Database, TxOptions};
use futures::FutureExt;

mod late_fire_common;
use late_fire_common::{armed_watch, hour_safety_look, FIRE_LIMIT};

async fn set(db: &EmbeddedStore, key: &[u8], value: &[u8]) {
    let tx = db.create_transaction(&TxOptions::write()).await.expect("tx");
    tx.set(key, value);
    tx.commit().await.expect("commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_commit_fires_the_watches_of_a_key_it_changed_itself() {
    let dir = tempfile::tempdir().expect("dir");
    let db = EmbeddedStore::open(hour_safety_look(dir.path())).expect("open");
    set(&db, b"k", b"v0").await;
    for (i, value) in [b"v1", b"v2", b"v3"].iter().enumerate() {
        let w = armed_watch(&*db, b"k").await;
        let thread_fired = db.watch_trace().expect("the helper's watch was fired by the thread");
        set(&db, b"k", *value).await;
        tokio::time::timeout(FIRE_LIMIT, w).await.expect("the change fires the watch").expect("fired");
        assert_eq!(db.watch_trace(), Some(thread_fired), "change {i}: the commit fired the watch, not the thread");
    }
    // A transaction that writes the key twice, and one that writes and
    // then clears it: the value before the first write is what counts.
    let w = armed_watch(&*db, b"k").await;
    let thread_fired = db.watch_trace();
    let tx = db.create_transaction(&TxOptions::write()).await.expect("tx");
    tx.set(b"k", b"x");
    tx.set(b"k", b"y");
    tx.commit().await.expect("commit");
    tokio::time::timeout(FIRE_LIMIT, w).await.expect("two writes fire the watch").expect("fired");
    assert_eq!(db.watch_trace(), thread_fired, "the commit fired the watch");
    let w = armed_watch(&*db, b"k").await;
    let thread_fired = db.watch_trace();
    let tx = db.create_transaction(&TxOptions::write()).await.expect("tx");
    tx.set(b"k", b"z");
    tx.clear(b"k");
    tx.commit().await.expect("commit");
    tokio::time::timeout(FIRE_LIMIT, w).await.expect("a write and a clear fire the watch").expect("fired");
    assert_eq!(db.watch_trace(), thread_fired, "the commit fired the watch");
    db.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_of_the_same_value_fires_nothing_and_the_next_change_does() {
    let dir = tempfile::tempdir().expect("dir");
    let db = EmbeddedStore::open(hour_safety_look(dir.path())).expect("open");
    set(&db, b"k", b"v0").await;
    let mut w = armed_watch(&*db, b"k").await;
    set(&db, b"k", b"v0").await;
    // A point after which the thread has read `k` again (the helper's
    // watch of another key is judged in a read of every watched key).
    let _other = armed_watch(&*db, b"k2").await;
    if let Some(fired) = w.as_mut().now_or_never() {
        panic!("a write of the value the watch expects fired it: {fired:?}");
    }
    set(&db, b"k", b"v1").await;
    tokio::time::timeout(FIRE_LIMIT, w).await.expect("the change fires the watch").expect("fired");
    db.close();
}

/// A writer this handle did not hear of (a bare SQLite connection sends
/// no wake-up) changed the key after the watch was armed: the local
/// commit finds a value the watch does not expect, so it cannot tell
/// which change the watch has seen, and leaves it to the thread, which
/// fires it on reading the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_expecting_a_value_another_writer_replaced_is_left_to_the_thread() {
    let dir = tempfile::tempdir().expect("dir");
    let db = EmbeddedStore::open(hour_safety_look(dir.path())).expect("open");
    set(&db, b"k", b"v0").await;
    let w = armed_watch(&*db, b"k").await;
    let before = db.watch_trace();
    let raw = rusqlite::Connection::open(db.path()).expect("bare connection");
    raw.busy_timeout(Duration::from_secs(5)).expect("busy timeout");
    raw.execute("INSERT OR REPLACE INTO kv (key, value) VALUES (?1, ?2)", (b"k".as_slice(), b"raw".as_slice()))
        .expect("bare write");
    set(&db, b"k", b"v1").await;
    tokio::time::timeout(FIRE_LIMIT, w).await.expect("the change fires the watch").expect("fired");
    assert_ne!(db.watch_trace(), before, "the thread fired the watch");
    db.close();
}

/// An atomic add before the transaction's write of the key: the value
/// read at the write already holds the add, not the one before the
/// transaction, so the commit leaves the key to the thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_added_to_before_its_write_is_left_to_the_thread() {
    let dir = tempfile::tempdir().expect("dir");
    let db = EmbeddedStore::open(hour_safety_look(dir.path())).expect("open");
    set(&db, b"k", &1i64.to_le_bytes()).await;
    let w = armed_watch(&*db, b"k").await;
    let before = db.watch_trace();
    let tx = db.create_transaction(&TxOptions::write()).await.expect("tx");
    tx.atomic_add(b"k", 1);
    assert_eq!(tx.get(b"k", false).await.expect("read"), Some(2i64.to_le_bytes().to_vec()));
    tx.set(b"k", &5i64.to_le_bytes());
    tx.commit().await.expect("commit");
    tokio::time::timeout(FIRE_LIMIT, w).await.expect("the change fires the watch").expect("fired");
    assert_ne!(db.watch_trace(), before, "the thread fired the watch");
    db.close();
}

/// Writers of one group commit (several tasks writing at once), each
/// changing the key: every watch armed before them fires once the batch
/// is visible, and a watch armed on the last value waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writers_of_a_group_commit_fire_the_watches_of_what_they_changed() {
    let dir = tempfile::tempdir().expect("dir");
    let db = EmbeddedStore::open(hour_safety_look(dir.path())).expect("open");
    set(&db, b"k", &0u64.to_be_bytes()).await;
    for round in 0..20u64 {
        let w = armed_watch(&*db, b"k").await;
        let writers: Vec<_> = (0..4u64)
            .map(|i| {
                let db = db.clone();
                tokio::spawn(async move { set(&db, b"k", &(round * 10 + i + 1).to_be_bytes()).await })
            })
            .collect();
        for writer in writers {
            writer.await.expect("writer");
        }
        tokio::time::timeout(FIRE_LIMIT, w).await.expect("the batch fires the watch").expect("fired");
    }
    let mut last = armed_watch(&*db, b"k").await;
    let _other = armed_watch(&*db, b"k2").await;
    assert!(last.as_mut().now_or_never().is_none(), "nothing changed since the last watch was armed");
    db.close();
}
