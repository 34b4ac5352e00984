//! The forwarding transaction (`store::forward`): a job operation run on
//! it, with every request performed on a `sim` transaction by an answering
//! side, makes exactly the writes of the same operation run directly, and
//! reads the same job back; a failed read ends the operation with that
//! error; an owner that goes away fails the reads still waiting. With a
//! session (`store::overlay`), a later operation in the same transaction
//! reads what an earlier one wrote with versionstamps, and a cancel of a
//! job added in it clears the versionstamped pending key it cannot name.

use std::sync::{Arc, Mutex};

use couch_workers_core::jobs::ops;
use couch_workers_core::jobs::{JobOpts, JobSpec};
use couch_workers_core::keyspace::Keyspace;
use couch_workers_core::store::forward::{self, Answer, Answers, Request, Sent};
use couch_workers_core::store::hooked::{Hooked, TxHooks, Write};
use couch_workers_core::store::overlay::{Overlaid, Session};
use couch_workers_core::store::sim::{SimOptions, SimStore};
use couch_workers_core::store::{Database, RangeRequest, StoreError, Transaction, Tx, TxOptions};
use couch_workers_core::Error;
use tokio::sync::mpsc::UnboundedReceiver;

const T: &[u8] = b"replication";
const NOW: u64 = 1_800_000_000_000;

fn spec(id: &[u8]) -> JobSpec {
    JobSpec { id: id.to_vec(), info: br#"{"source":"a"}"#.to_vec(), opts: JobOpts::priority(3) }
}

/// A write as a request of the forwarding transaction.
fn as_request(write: Write<'_>) -> Request {
    match write {
        Write::Set { key, value } => Request::Set { key: key.to_vec(), value: value.to_vec() },
        Write::Clear { key } => Request::Clear { key: key.to_vec() },
        Write::ClearRange { begin, end } => Request::ClearRange { begin: begin.to_vec(), end: end.to_vec() },
        Write::AtomicAdd { key, delta } => Request::AtomicAdd { key: key.to_vec(), param: delta.to_le_bytes() },
        Write::AtomicByteMax { key, value } => Request::AtomicByteMax { key: key.to_vec(), value: value.to_vec() },
        Write::SetVersionstampedKey { key, value } => {
            Request::SetVersionstampedKey { key: key.to_vec(), value: value.to_vec() }
        }
        Write::SetVersionstampedValue { key, value } => {
            Request::SetVersionstampedValue { key: key.to_vec(), value: value.to_vec() }
        }
    }
}

/// Records the writes of a direct run.
#[derive(Default, Clone)]
struct Writes(Arc<Mutex<Vec<Request>>>);

impl TxHooks for Writes {
    fn write(&self, write: Write<'_>) {
        self.0.lock().unwrap().push(as_request(write));
    }
}

/// The owner's side: performs every request on `inner`, in id order, and
/// answers the reads; returns the requests it saw. `fail` answers the
/// read of that id with the error instead.
async fn serve(
    mut requests: UnboundedReceiver<Sent>,
    answers: Answers,
    inner: Tx,
    fail: Option<(u64, StoreError)>,
) -> Vec<Request> {
    let mut seen = Vec::new();
    while let Some(Sent { id, request }) = requests.recv().await {
        assert_eq!(id, seen.len() as u64, "ids follow the order of the calls");
        let answer = match &fail {
            Some((at, err)) if *at == id => Some(Answer::Failed(err.clone())),
            _ => perform(&inner, &request).await,
        };
        if let Some(answer) = answer {
            assert!(answers.answer(id, answer), "read {id} was waiting");
        }
        seen.push(request);
    }
    seen
}

async fn perform(tx: &Tx, request: &Request) -> Option<Answer> {
    let answer = |r: Result<Answer, StoreError>| Some(r.unwrap_or_else(Answer::Failed));
    match request {
        Request::Get { key, snapshot } => answer(tx.get(key, *snapshot).await.map(Answer::Value)),
        Request::GetRange(range) => answer(tx.get_range(range).await.map(Answer::Range)),
        Request::ReadVersion => answer(tx.read_version().await.map(Answer::Version)),
        Request::Set { key, value } => {
            tx.set(key, value);
            None
        }
        Request::Clear { key } => {
            tx.clear(key);
            None
        }
        Request::ClearRange { begin, end } => {
            tx.clear_range(begin, end);
            None
        }
        Request::AtomicAdd { key, param } => {
            tx.atomic_add(key, i64::from_le_bytes(*param));
            None
        }
        Request::AtomicByteMax { key, value } => {
            tx.atomic_byte_max(key, value);
            None
        }
        Request::SetVersionstampedKey { key, value } => {
            tx.set_versionstamped_key(key, value);
            None
        }
        Request::SetVersionstampedValue { key, value } => {
            tx.set_versionstamped_value(key, value);
            None
        }
        Request::AddReadConflictKey { key } => {
            tx.add_read_conflict_key(key);
            None
        }
        // The store trait has no conflict range: the session's clear of its
        // own versionstamped key is checked for its writes here, and for
        // its conflict on FoundationDB (test/couch_workers_tx_tests.erl).
        Request::AddReadConflictRange { .. } => None,
    }
}

/// Runs `op` on a forwarding transaction whose owner is `inner`.
async fn forwarded<T, F, Fut>(inner: Tx, fail: Option<(u64, StoreError)>, op: F) -> (T, Vec<Request>)
where
    F: FnOnce(Tx) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let (fwd, requests, answers) = forward::channel();
    let tx: Tx = Arc::new(fwd);
    // The operation drops its transaction when it ends, which ends the
    // owner's loop.
    tokio::join!(op(tx), serve(requests, answers, inner, fail))
}

/// Equal, or of one length and different only within 10 bytes (where
/// each store's commit versionstamp sits).
fn same_but_a_versionstamp(a: &[u8], b: &[u8]) -> bool {
    same_but_windows(a, b, 1)
}

/// Of one length and different only within at most `windows` spans of 10
/// bytes (a record: its commit's versionstamp and its incarnation, drawn
/// at each add).
fn same_but_windows(a: &[u8], b: &[u8], windows: usize) -> bool {
    let differ: Vec<usize> = (0..a.len().max(b.len())).filter(|&i| a.get(i) != b.get(i)).collect();
    let mut spans = 0;
    let mut start = None;
    for &i in &differ {
        if start.is_none_or(|s| i - s >= 10) {
            spans += 1;
            start = Some(i);
        }
    }
    a.len() == b.len() && spans <= windows
}

async fn dump(db: &dyn Database) -> Vec<(Vec<u8>, Vec<u8>)> {
    let tx = db.create_transaction(&TxOptions::read()).await.unwrap();
    tx.get_range(&RangeRequest::new(Vec::new(), vec![0xff])).await.unwrap()
}

#[tokio::test]
async fn add_then_get_through_the_channel_is_the_direct_run() {
    let direct_db = SimStore::new(SimOptions::new(1));
    let owner_db = SimStore::new(SimOptions::new(1));
    let ks = Keyspace::new(&direct_db.prefix());
    assert_eq!(direct_db.prefix(), owner_db.prefix());

    // Directly, the writes recorded by a hook.
    let writes = Writes::default();
    let inner = direct_db.create_transaction(&TxOptions::write()).await.unwrap();
    let direct: Tx = Arc::new(Hooked::new(inner, writes.clone()));
    assert_eq!(ops::add_job(&direct, &ks, T, &spec(b"doc-1"), NOW).await, Ok(Ok(())));
    direct.commit().await.unwrap();

    // Through the channel, performed on the owner's transaction.
    let owner = owner_db.create_transaction(&TxOptions::write()).await.unwrap();
    let ks2 = ks.clone();
    let (added, requests) =
        forwarded(owner.clone(), None, |tx| async move { ops::add_job(&tx, &ks2, T, &spec(b"doc-1"), NOW).await })
            .await;
    assert_eq!(added, Ok(Ok(())));
    let sent_writes: Vec<Request> = requests.iter().filter(|r| !r.is_read()).cloned().collect();
    assert!(!sent_writes.is_empty());
    // The same writes in the same order, but for the record's incarnation
    // (8 bytes drawn at each add: jobs::record).
    let direct_writes = writes.0.lock().unwrap().clone();
    assert_eq!(sent_writes.len(), direct_writes.len(), "{sent_writes:?}\n{direct_writes:?}");
    for (sent, direct) in sent_writes.iter().zip(&direct_writes) {
        match (sent, direct) {
            (
                Request::SetVersionstampedValue { key: ka, value: va },
                Request::SetVersionstampedValue { key: kb, value: vb },
            ) => assert!(ka == kb && same_but_windows(va, vb, 1), "{sent:?} / {direct:?}"),
            _ => assert_eq!(sent, direct),
        }
    }
    assert!(requests.iter().any(|r| matches!(r, Request::Get { .. })), "the existence check was forwarded");
    owner.commit().await.unwrap();

    // The same keys and values in both stores, but for the commit's
    // versionstamp (in the pending key, the record), which each store chose.
    let (a, b) = (dump(direct_db.as_ref()).await, dump(owner_db.as_ref()).await);
    assert_eq!(a.len(), b.len(), "{a:?}\n{b:?}");
    for ((ka, va), (kb, vb)) in a.iter().zip(&b) {
        assert!(same_but_a_versionstamp(ka, kb), "{ka:?} / {kb:?}");
        assert!(same_but_windows(va, vb, 2), "{va:?} / {vb:?}");
    }

    // A get through the channel answers what a direct get answers.
    let reader = owner_db.create_transaction(&TxOptions::read()).await.unwrap();
    let want = ops::get(&reader, &ks, T, b"doc-1").await.unwrap().expect("the job was added");
    let ks3 = ks.clone();
    let (got, requests) =
        forwarded(reader.clone(), None, |tx| async move { ops::get(&tx, &ks3, T, b"doc-1").await }).await;
    assert_eq!(got, Ok(Some(want.clone())));
    assert!(requests.iter().all(Request::is_read), "a get writes nothing: {requests:?}");
    assert_eq!(want.info, spec(b"doc-1").info);

    // A second add through the channel finds the job.
    let owner = owner_db.create_transaction(&TxOptions::write()).await.unwrap();
    let ks4 = ks.clone();
    let (again, requests) =
        forwarded(owner, None, |tx| async move { ops::add_job(&tx, &ks4, T, &spec(b"doc-1"), NOW).await }).await;
    assert_eq!(again, Ok(Err(Error::AlreadyExists)));
    assert!(requests.iter().all(Request::is_read), "an add that finds the job writes nothing");
}

#[tokio::test]
async fn a_failed_read_ends_the_operation_with_its_error() {
    let db = SimStore::new(SimOptions::new(2));
    let ks = Keyspace::new(&db.prefix());
    let owner = db.create_transaction(&TxOptions::write()).await.unwrap();
    let (added, requests) = forwarded(owner, Some((0, StoreError::TooOld)), |tx| async move {
        ops::add_job(&tx, &ks, T, &spec(b"doc-2"), NOW).await
    })
    .await;
    assert_eq!(added, Err(StoreError::TooOld));
    assert_eq!(requests.len(), 1, "nothing after the failed read: {requests:?}");
}

#[tokio::test]
async fn an_owner_gone_fails_the_waiting_read() {
    let (fwd, mut requests, answers) = forward::channel();
    let read = tokio::spawn(async move { fwd.get(b"k", false).await });
    let sent = requests.recv().await.expect("the read was sent");
    assert_eq!(sent, Sent { id: 0, request: Request::Get { key: b"k".to_vec(), snapshot: false } });
    drop(answers);
    assert_eq!(read.await.unwrap(), Err(StoreError::Closed));
}

#[tokio::test]
async fn watch_and_commit_are_the_owners() {
    let (fwd, _requests, _answers) = forward::channel();
    assert!(matches!(fwd.watch(b"k").await, Err(StoreError::Invalid(_))));
    assert!(matches!(fwd.commit().await, Err(StoreError::Invalid(_))));
    assert_eq!(fwd.on_error(StoreError::Conflict).await, Err(StoreError::Conflict));
}

/// Runs `op` on an overlaid forwarding transaction of `session` whose
/// owner is `inner`.
async fn in_session<T, F, Fut>(inner: Tx, session: &Arc<Session>, op: F) -> (T, Vec<Request>)
where
    F: FnOnce(Tx) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let (fwd, requests, answers) = forward::channel();
    let tx: Tx = Arc::new(Overlaid::new(fwd, session.clone()));
    tokio::join!(op(tx), serve(requests, answers, inner, None))
}

#[tokio::test]
async fn a_session_reads_back_and_cancels_what_it_added() {
    let db = SimStore::new(SimOptions::new(3));
    let ks = Keyspace::new(&db.prefix());
    let owner = db.create_transaction(&TxOptions::write()).await.unwrap();
    let session = Session::new(owner.read_version().await.unwrap());

    let k = ks.clone();
    let (added, _) =
        in_session(owner.clone(), &session, |tx| async move { ops::add_job(&tx, &k, T, &spec(b"doc-3"), NOW).await })
            .await;
    assert_eq!(added, Ok(Ok(())));
    // Read back: the owner's store would refuse this read (accessed_unreadable).
    let k = ks.clone();
    let (got, requests) =
        in_session(owner.clone(), &session, |tx| async move { ops::get(&tx, &k, T, b"doc-3").await }).await;
    let job = got.unwrap().expect("the job added in this transaction");
    assert_eq!(job.info, spec(b"doc-3").info);
    assert_eq!(job.state.name(), "pending");
    assert!(!requests.iter().any(|r| matches!(r, Request::Get { .. })), "answered by the session: {requests:?}");
    // Canceled in the same transaction: its pending key, whose bytes only
    // the commit knows, is cleared as the range it may become.
    let k = ks.clone();
    let (canceled, requests) =
        in_session(owner.clone(), &session, |tx| async move { ops::cancel(&tx, &k, T, b"doc-3").await }).await;
    assert_eq!(canceled.unwrap().unwrap().state.name(), "canceled");
    assert!(requests.iter().any(|r| matches!(r, Request::AddReadConflictRange { .. })), "{requests:?}");
    owner.commit().await.unwrap();

    let reader = db.create_transaction(&TxOptions::read()).await.unwrap();
    let job = ops::get(&reader, &ks, T, b"doc-3").await.unwrap().expect("committed");
    assert_eq!(job.state.name(), "canceled");
    let (begin, end) = ks.pending_range(T);
    assert_eq!(reader.get_range(&RangeRequest::new(begin, end)).await.unwrap(), vec![], "no pending key left");
    assert_eq!(ops::pending_count(&reader, &ks, T).await.unwrap(), 0);
    let counts = ops::counts(&reader, &ks, T).await.unwrap();
    assert_eq!(counts.iter().sum::<u64>(), 1, "one job, canceled: {counts:?}");
}
