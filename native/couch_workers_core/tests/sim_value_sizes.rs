//! The job queue's size checks count a record as FoundationDB counts it
//! (issue 14 point 7): the versionstamped parameter with its 4-byte
//! offset. At the boundary, on the `sim` store (which checks values as
//! FDB does): a record of exactly 100,000 counted bytes is written; one
//! byte more is refused by the queue's own check, before anything is
//! written, rather than passing it and failing at the store (before the
//! fix the check subtracted the offset, so 100,001-byte parameters passed
//! it).

use couch_workers_core::jobs::ops;
use couch_workers_core::jobs::NewJob;
use couch_workers_core::keyspace::Keyspace;
use couch_workers_core::store::sim::{SimOptions, SimStore};
use couch_workers_core::store::{Db, StoreError, TxOptions, MAX_VALUE_SIZE};
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

async fn add_in_one_tx(db: &Db, ks: &Keyspace, id: &[u8], info: Vec<u8>) -> (Result<Result<(), Error>, StoreError>, Result<(), StoreError>) {
    let tx = db.create_transaction(&TxOptions::write()).await.expect("transaction");
    let job = NewJob { id: id.to_vec(), info, priority: 0 };
    let answer = ops::add(&tx, ks, T, &job).await;
    let commit = tx.commit().await.map(|_| ());
    (answer, commit)
}

#[tokio::test]
async fn a_record_at_the_value_limit_as_fdb_counts_it_is_written_one_byte_more_is_refused_by_the_check() {
    let sim = SimStore::new(SimOptions::new(7));
    let db: Db = sim.clone();
    let ks = Keyspace::new(&db.prefix());

    let overhead = record_overhead(&db, &ks).await;
    let info_for = |counted: usize| vec![b'x'; counted - overhead];
    let (answer, commit) = add_in_one_tx(&db, &ks, b"at", info_for(MAX_VALUE_SIZE)).await;
    assert_eq!(answer, Ok(Ok(())), "a record of exactly the limit passes the check");
    assert_eq!(commit, Ok(()), "and the store takes it");
    let tx = db.create_transaction(&TxOptions::read()).await.expect("transaction");
    let stored = tx.get(&ks.job(T, b"at"), false).await.expect("read").expect("written");
    assert_eq!(stored.len(), MAX_VALUE_SIZE - 4, "stored without the offset");

    let (answer, commit) = add_in_one_tx(&db, &ks, b"over", info_for(MAX_VALUE_SIZE + 1)).await;
    assert_eq!(
        answer,
        Ok(Err(Error::Store(StoreError::ValueTooLarge))),
        "one byte over, counting the offset: the queue's check refuses it (before: it passed, and the commit failed)"
    );
    assert_eq!(commit, Ok(()), "nothing was written, so the commit has nothing to refuse");
    let tx = db.create_transaction(&TxOptions::read()).await.expect("transaction");
    assert_eq!(tx.get(&ks.job(T, b"over"), false).await, Ok(None));
    assert_eq!(ops::pending_count(&tx, &ks, T).await, Ok(2), "the probe and the job at the limit");
}
