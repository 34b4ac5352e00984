//! The job queue's size checks count a record as FoundationDB counts it:
//! the versionstamped parameter with its 4-byte offset. At the boundary, on the `sim` store (which checks values as
//! FDB does) and on a live FoundationDB: the largest record the check passes is written; one byte
//! more is refused by the queue's own check, before anything is written,
//! rather than passing it and failing at the store (before the fix the
//! check subtracted the offset, so 100,001-byte parameters passed it).
//! The check's limit now also keeps room for the record to run (issue
//! 14's leftover, `tests/jobs_value_room.rs`), so the largest record is
//! about a worker id under the value limit; `Record::value_len` itself is
//! pinned at the byte in `jobs/record.rs`'s unit test.

use couch_workers_core::jobs::ops;
use couch_workers_core::jobs::NewJob;
use couch_workers_core::keyspace::Keyspace;
use couch_workers_core::store::{Db, StoreError, TxOptions, MAX_VALUE_SIZE};
use couch_workers_core::test_store::{StoreKind, TestStore};
use couch_workers_core::Error;

const T: &[u8] = b"t";

/// The bytes a new job's record adds to its info, as FDB counts them (the
/// stored record plus the 4-byte offset), measured on a probe job.
async fn record_overhead(db: &Db, ks: &Keyspace) -> usize {
    let probe = 1_000;
    let (answer, commit) = add_in_one_tx(db, ks, b"probe", vec![b'x'; probe]).await;
    assert_eq!((answer, commit), (Ok(Ok(())), Ok(())));
    let tx = db.create_transaction(&TxOptions::read()).await.expect("transaction");
    let stored = tx.get(&ks.job(T, b"probe"), false).await.expect("read").expect("probe written");
    stored.len() + 4 - probe
}

async fn add_in_one_tx(
    db: &Db,
    ks: &Keyspace,
    id: &[u8],
    info: Vec<u8>,
) -> (Result<Result<(), Error>, StoreError>, Result<(), StoreError>) {
    let tx = db.create_transaction(&TxOptions::write()).await.expect("transaction");
    let job = NewJob { id: id.to_vec(), info, priority: 0 };
    let answer = ops::add(&tx, ks, T, &job).await;
    let commit = tx.commit().await.map(|_| ());
    (answer, commit)
}

/// The largest info `ops::add` takes for a job of a two-byte id (the
/// room kept depends on the id's length): bisection on fresh ids of that
/// length; nothing a refused add tried is written.
async fn largest_add(db: &Db, ks: &Keyspace, overhead: usize) -> usize {
    let (mut fits, mut over) = (1_000, MAX_VALUE_SIZE - overhead + 1);
    let mut n = 0;
    while over - fits > 1 {
        let mid = (fits + over) / 2;
        n += 1;
        let (answer, commit) = add_in_one_tx(db, ks, format!("{n:02}").as_bytes(), vec![b'x'; mid]).await;
        assert_eq!(commit, Ok(()), "the store takes whatever the check passes");
        match answer {
            Ok(Ok(())) => fits = mid,
            other => {
                assert_eq!(other, Ok(Err(Error::Store(StoreError::ValueTooLarge))));
                over = mid;
            }
        }
    }
    fits
}

async fn the_largest_record_the_check_passes_is_written_one_byte_more_is_refused_by_the_check(kind: StoreKind) {
    let store = TestStore::with_seed(kind, 7);
    let db: Db = store.db();
    let ks = Keyspace::new(&db.prefix());

    let overhead = record_overhead(&db, &ks).await;
    // The check's limit is the value limit as FDB counts it, less the room
    // the record needs to run for the longest worker id (the
    // accept of such a job: tests/jobs_value_room.rs): under the limit,
    // by about that id's length.
    let largest = largest_add(&db, &ks, overhead).await;
    let longest_worker = couch_workers_core::store::MAX_KEY_SIZE - ks.active(T, b"", b"at").len();
    assert!(largest + overhead <= MAX_VALUE_SIZE - longest_worker, "{largest}: no room to run");
    assert!(largest + overhead > MAX_VALUE_SIZE - longest_worker - 100, "{largest}: more room kept than a run needs");

    let (answer, commit) = add_in_one_tx(&db, &ks, b"at", vec![b'x'; largest]).await;
    assert_eq!(answer, Ok(Ok(())), "the largest record passes the check");
    assert_eq!(commit, Ok(()), "and the store takes it");
    let tx = db.create_transaction(&TxOptions::read()).await.expect("transaction");
    let stored = tx.get(&ks.job(T, b"at"), false).await.expect("read").expect("written");
    assert_eq!(stored.len() + 4, largest + overhead, "counted as FDB counts it: stored, plus the offset");

    let (answer, commit) = add_in_one_tx(&db, &ks, b"ov", vec![b'x'; largest + 1]).await;
    assert_eq!(answer, Ok(Err(Error::Store(StoreError::ValueTooLarge))), "one byte more: the queue's check refuses it");
    assert_eq!(commit, Ok(()), "nothing was written, so the commit has nothing to refuse");
    let tx = db.create_transaction(&TxOptions::read()).await.expect("transaction");
    assert_eq!(tx.get(&ks.job(T, b"ov"), false).await, Ok(None));
}

couch_workers_core::store_tests!(
    runtime: (),
    stores: [sim: Sim],
    tests: [the_largest_record_the_check_passes_is_written_one_byte_more_is_refused_by_the_check],
);
