//! A job must have room in the value limit for every state it can reach.
//! Running, a record holds its worker's id and an
//! accept token that the pending record does not: before, `add` took a
//! record right up to the limit, and then no accept could write its
//! running record, so every accept round of its type that reached it
//! failed with `value_too_large`, and the jobs behind it were never
//! taken. Now `add`, `update` (and release, retry, resubmit) refuse info
//! that leaves no room to run for the longest worker id that can hold the
//! job, and an accept round that meets a record stored before this (too
//! large to run for any worker) fails that job, and logs why, instead of
//! stopping. On `sim` (FDB's limits), on the embedded store and on a
//! live FoundationDB.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use couch_workers_core::jobs::{JobState, Retry};
use couch_workers_core::keyspace::Keyspace;
use couch_workers_core::log::{Event, Sink, Value};
use couch_workers_core::store::{run, Db, StoreError, TxOptions, MAX_KEY_SIZE, MAX_VALUE_SIZE};
use couch_workers_core::test_store::{StoreKind, TestStore};
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Error, Node, Settings};
use foundationdb_tuple::{pack, unpack, Bytes, Element};

const T: &[u8] = b"room";
/// Long enough that the active key, not a key of the registration, is
/// what limits the ids of its workers.
const BIG: &[u8] = b"a-job-whose-id-is-longer-than-the-keys-of-a-registration-add";
/// Long enough for a blocking accept on a loaded machine; a stalled queue
/// fails it by timing out.
const ACCEPT: Duration = Duration::from_secs(20);
const TOO_LARGE: Error = Error::Store(StoreError::ValueTooLarge);

/// The log events of `job_failed_unrunnable`, with their ids.
#[derive(Default)]
struct Unrunnable(Mutex<Vec<Vec<u8>>>);

impl Sink for Unrunnable {
    fn log(&self, event: Event) {
        if event.what == "job_failed_unrunnable" {
            for (k, v) in event.fields {
                if let ("id", Value::Bytes(id)) = (k, v) {
                    self.0.lock().unwrap().push(id);
                }
            }
        }
    }
}

/// Each test runs on each store (`store_tests!` below): the sim, the
/// embedded one in a temporary directory, a live FoundationDB; the store
/// is removed at the end.
async fn on_store<F, Fut>(kind: StoreKind, test: F)
where
    F: FnOnce(&'static str, Db) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let store = TestStore::with_seed(kind, 14);
    test(kind.name(), store.db()).await;
}

fn node(db: &Db, log: Arc<Unrunnable>) -> Arc<Node> {
    Node::with_db(db.clone(), Settings::default(), log)
}

fn spec(id: &[u8]) -> WorkerSpec {
    WorkerSpec { worker_type: T.to_vec(), id: id.to_vec(), options_json: b"{}".to_vec(), timeout_s: 600 }
}

/// The longest worker id that can hold job `id`: its active key is
/// exactly at the key limit.
fn longest_worker(ks: &Keyspace, id: &[u8]) -> Vec<u8> {
    vec![b'w'; MAX_KEY_SIZE - ks.active(T, b"", id).len()]
}

fn info(len: usize) -> Vec<u8> {
    let mut info = br#"{"d":""#.to_vec();
    info.resize(len - 2, b'x');
    info.extend_from_slice(br#""}"#);
    info
}

/// The largest info `add` takes for job `id`, found by bisection with
/// adds that are removed again; checks that one byte more is refused.
async fn largest_info(node: &Node, id: &[u8]) -> usize {
    let (mut fits, mut over) = (1_000, MAX_VALUE_SIZE);
    while over - fits > 1 {
        let mid = (fits + over) / 2;
        match node.jobs().add(T, id, &info(mid), 0).await {
            Ok(()) => {
                node.jobs().remove(T, id).await.expect("remove the probe");
                fits = mid;
            }
            Err(e) => {
                assert_eq!(e, TOO_LARGE, "only the size refuses it");
                over = mid;
            }
        }
    }
    fits
}

async fn a_job_of_the_largest_info_add_takes_is_accepted_and_the_queue_behind_it_moves(kind: StoreKind) {
    on_store(kind, |store, db| async move {
        let log = Arc::new(Unrunnable::default());
        let node = node(&db, log.clone());
        let ks = Keyspace::new(&db.prefix());
        let long = longest_worker(&ks, BIG);
        let _long = node.register_worker(spec(&long)).await.expect("register the longest id");
        let _short = node.register_worker(spec(b"w")).await.expect("register");

        let largest = largest_info(&node, BIG).await;
        node.jobs().add(T, BIG, &info(largest), 0).await.expect("the largest add");
        node.jobs().add(T, b"next", b"{}", 0).await.expect("a job behind it");

        // The worst worker for it: the longest id. Before the fix the
        // round failed with value_too_large at every try, and this timed
        // out with nothing taken.
        let h = node
            .jobs()
            .accept(T, &long, ACCEPT)
            .await
            .unwrap_or_else(|e| panic!("{store}: accept the largest job: {e}"));
        assert_eq!((h.job.id.as_slice(), h.job.info.len()), (BIG, largest), "{store}");
        let next =
            node.jobs().accept(T, b"w", ACCEPT).await.unwrap_or_else(|e| panic!("{store}: the job behind it: {e}"));
        assert_eq!(next.job.id, b"next", "{store}");
        // The reserve is what running for the longest id costs: about
        // that id, plus the token and the integers.
        assert!(largest < MAX_VALUE_SIZE - long.len(), "{store}: {largest} leaves no room for the worker id");
        assert!(largest > MAX_VALUE_SIZE - long.len() - 200, "{store}: {largest}: more reserved than a run needs");

        // It can be given back and run again by the longest id, after a
        // lost run's error too (a failure that retries is the same path).
        node.jobs().fail(&h.fence(), b"{}", Retry::After(0)).await.expect("fail and retry");
        let again = node.jobs().accept(T, &long, ACCEPT).await.unwrap_or_else(|e| panic!("{store}: accept again: {e}"));
        assert_eq!((again.job.id.as_slice(), again.job.attempts), (BIG, 2), "{store}");
        assert!(log.0.lock().unwrap().is_empty(), "{store}: nothing failed as unrunnable");
        node.stop().await;
    })
    .await;
}

async fn update_refuses_info_that_leaves_no_room_to_run_and_writes_nothing(kind: StoreKind) {
    on_store(kind, |store, db| async move {
        let node = node(&db, Arc::new(Unrunnable::default()));
        let _w = node.register_worker(spec(b"w")).await.expect("register");
        let largest = largest_info(&node, BIG).await;
        node.jobs().add(T, BIG, b"{}", 0).await.expect("add");
        let h = node.jobs().accept(T, b"w", Duration::ZERO).await.expect("accept");
        // Running for a short id, the record would still fit: before, this
        // was taken, and a release or a lost run then queued a job no
        // long-id worker could accept.
        assert_eq!(node.jobs().update(&h.fence(), &info(largest + 1)).await.err(), Some(TOO_LARGE), "{store}");
        assert_eq!(node.jobs().get(T, BIG).await.expect("get").info, b"{}", "{store}: nothing written");
        let updated = node.jobs().update(&h.fence(), &info(largest)).await.expect("the largest update");
        assert_eq!(updated.job.info.len(), largest, "{store}");
        // The same limit for what a release puts back.
        let bigger = info(largest + 1);
        let opts = Default::default();
        assert_eq!(node.jobs().release(&h.fence(), &opts, Some(&bigger)).await, Err(TOO_LARGE), "{store}");
        assert_eq!(node.jobs().get(T, BIG).await.expect("get").state, JobState::Running, "{store}: still running");
        node.stop().await;
    })
    .await;
}

/// Rewrites job `id`'s stored record with `info` in place of its info,
/// as code before the reserve could have stored it.
async fn grow_stored_record(db: &Db, ks: &Keyspace, id: &[u8], stored_len: usize) {
    let key = ks.job(T, id);
    let write = TxOptions { timeout: Duration::from_secs(20), ..TxOptions::write() };
    run(db.as_ref(), write, |tx| {
        let key = key.clone();
        async move {
            let value = tx.get(&key, false).await?.expect("the job's record");
            let mut e: Vec<Element> = unpack(&value).expect("a tuple");
            let short = pack(&e).len();
            let old_len = e[8].as_bytes().expect("info").len();
            let grown = vec![b'x'; stored_len - short + old_len];
            e[8] = Element::Bytes(Bytes::from(grown));
            let value = pack(&e);
            assert_eq!(value.len(), stored_len);
            tx.set(&key, &value);
            Ok(())
        }
    })
    .await
    .expect("rewrite the record");
}

async fn an_accept_round_fails_a_stored_record_too_large_to_run_and_takes_the_next(kind: StoreKind) {
    on_store(kind, |store, db| async move {
        let log = Arc::new(Unrunnable::default());
        let node = node(&db, log.clone());
        let ks = Keyspace::new(&db.prefix());
        let _w = node.register_worker(spec(b"w")).await.expect("register");
        node.jobs().add(T, b"old", br#"{"d":""}"#, 0).await.expect("add");
        node.jobs().add(T, b"next", b"{}", 0).await.expect("add the next");
        // At the limit as the old code wrote it (a versionstamped value of
        // 100,000 bytes with its offset): pending, it fits; running, not.
        grow_stored_record(&db, &ks, b"old", MAX_VALUE_SIZE - 4).await;
        let old = node.jobs().get(T, b"old").await.expect("get");
        assert_eq!(old.state, JobState::Pending);

        let h = node
            .jobs()
            .accept(T, b"w", ACCEPT)
            .await
            .unwrap_or_else(|e| panic!("{store}: the queue behind it stalled: {e}"));
        assert_eq!(h.job.id, b"next", "{store}");
        let failed = node.jobs().get(T, b"old").await.expect("get");
        assert_eq!(failed.state, JobState::Failed, "{store}");
        assert_eq!(failed.info, old.info, "{store}: its data is kept");
        assert_eq!(failed.attempts, 0, "{store}: never ran");
        assert_eq!(failed.error, None, "{store}: no room for a reason in the record; the log has it");
        assert_eq!(log.0.lock().unwrap().as_slice(), [b"old".to_vec()], "{store}: logged once");
        let counts = node.jobs().counts(T).await.expect("counts");
        let count = |s: JobState| counts.iter().find(|(c, _)| *c == s).map(|(_, n)| *n);
        assert_eq!(
            (count(JobState::Pending), count(JobState::Running), count(JobState::Failed)),
            (Some(0), Some(1), Some(1)),
            "{store}"
        );
        node.stop().await;
    })
    .await;
}

couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread", worker_threads = 2),
    stores: [sim: Sim, embedded: Embedded],
    tests: [
        a_job_of_the_largest_info_add_takes_is_accepted_and_the_queue_behind_it_moves,
        update_refuses_info_that_leaves_no_room_to_run_and_writes_nothing,
        an_accept_round_fails_a_stored_record_too_large_to_run_and_takes_the_next,
    ],
);
