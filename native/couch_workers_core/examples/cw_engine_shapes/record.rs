//! Records J2's shape from a real run: a node on the embedded store, whose
//! transactions pass through a recording wrapper while one accept round
//! takes one job and the worker finishes it (the calls J2's workers make:
//! `JobService::accept` with a timeout, then `finish`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use couch_workers_core::log::Discard;
use couch_workers_core::store::backoff::BackoffPolicy;
use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::{
    CommitInfo, Database, Db, KeyValue, RangeRequest, StoreError, Transaction, Tx, TxOptions, Watch,
};
use couch_workers_core::workers::WorkerSpec;
use couch_workers_core::{Node, Settings};

use crate::shape::{job_id, Op, Shape, TxShape};

type Log = Arc<Mutex<Vec<(TxShape, CommitInfo)>>>;

/// A store whose transactions are recorded while `on` is set.
struct Recorder {
    inner: Db,
    on: Arc<AtomicBool>,
    log: Log,
}

struct RecTx {
    inner: Tx,
    shape: Mutex<TxShape>,
    log: Log,
}

impl RecTx {
    fn push(&self, op: Op) {
        self.shape.lock().unwrap().ops.push(op);
    }
}

#[async_trait]
impl Transaction for RecTx {
    async fn get(&self, key: &[u8], snapshot: bool) -> Result<Option<Vec<u8>>, StoreError> {
        self.push(Op::Get(key.to_vec()));
        self.inner.get(key, snapshot).await
    }
    async fn get_range(&self, r: &RangeRequest) -> Result<Vec<KeyValue>, StoreError> {
        self.push(Op::Range { begin: r.begin.clone(), end: r.end.clone(), limit: r.limit, reverse: r.reverse });
        self.inner.get_range(r).await
    }
    async fn read_version(&self) -> Result<u64, StoreError> {
        self.inner.read_version().await
    }
    fn set(&self, key: &[u8], value: &[u8]) {
        self.push(Op::Set(key.to_vec(), value.to_vec()));
        self.inner.set(key, value)
    }
    fn clear(&self, key: &[u8]) {
        self.push(Op::Clear(key.to_vec()));
        self.inner.clear(key)
    }
    fn clear_range(&self, begin: &[u8], end: &[u8]) {
        self.push(Op::ClearRange(begin.to_vec(), end.to_vec()));
        self.inner.clear_range(begin, end)
    }
    fn atomic_add(&self, key: &[u8], delta: i64) {
        self.push(Op::Add(key.to_vec(), delta));
        self.inner.atomic_add(key, delta)
    }
    fn atomic_byte_max(&self, key: &[u8], value: &[u8]) {
        self.push(Op::ByteMax(key.to_vec(), value.to_vec()));
        self.inner.atomic_byte_max(key, value)
    }
    fn set_versionstamped_key(&self, key: &[u8], value: &[u8]) {
        self.push(Op::StampKey(key.to_vec(), value.to_vec()));
        self.inner.set_versionstamped_key(key, value)
    }
    fn set_versionstamped_value(&self, key: &[u8], value: &[u8]) {
        self.push(Op::StampValue(key.to_vec(), value.to_vec()));
        self.inner.set_versionstamped_value(key, value)
    }
    fn add_read_conflict_key(&self, key: &[u8]) {
        self.push(Op::Other);
        self.inner.add_read_conflict_key(key)
    }
    fn watch(&self, key: &[u8]) -> Watch {
        self.push(Op::Other);
        self.inner.watch(key)
    }
    async fn commit(&self) -> Result<CommitInfo, StoreError> {
        let info = self.inner.commit().await?;
        self.log.lock().unwrap().push((self.shape.lock().unwrap().clone(), info));
        Ok(info)
    }
    async fn on_error(&self, err: StoreError) -> Result<(), StoreError> {
        // A retry runs the calls again: keep only the attempt that commits.
        self.shape.lock().unwrap().ops.clear();
        self.inner.on_error(err).await
    }
}

#[async_trait]
impl Database for Recorder {
    async fn create_transaction(&self, opts: &TxOptions) -> Result<Tx, StoreError> {
        let inner = self.inner.create_transaction(opts).await?;
        if !self.on.load(Ordering::SeqCst) {
            return Ok(inner);
        }
        let shape = Mutex::new(TxShape { writes: opts.writes, ops: Vec::new() });
        Ok(Arc::new(RecTx { inner, shape, log: self.log.clone() }))
    }
    fn prefix(&self) -> Vec<u8> {
        self.inner.prefix()
    }
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn durability(&self) -> String {
        self.inner.durability()
    }
    fn versions_follow_time(&self) -> bool {
        self.inner.versions_follow_time()
    }
    fn commits_may_be_unknown(&self) -> bool {
        self.inner.commits_may_be_unknown()
    }
    fn backoff_policy(&self) -> BackoffPolicy {
        self.inner.backoff_policy()
    }
    fn close(&self) {
        self.inner.close()
    }
}

/// Runs the recording: two pending jobs of type `j2`, one registered
/// worker; the round that takes the first and its finish are recorded.
/// Returns the shape and how many transactions the node's services ran
/// meanwhile that touch none of the job's keys (left out of the shape).
pub fn record(dir: &std::path::Path) -> (Shape, usize) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let store = EmbeddedStore::open(EmbeddedOptions::new(dir)).expect("open the store");
    let on = Arc::new(AtomicBool::new(false));
    let log: Log = Arc::default();
    let db: Db = Arc::new(Recorder { inner: store.clone(), on: on.clone(), log: log.clone() });
    let node = rt.block_on(async { Node::with_db(db.clone(), Settings::default(), Arc::new(Discard)) });
    let (shape, left_out) = rt.block_on(async {
        let spec =
            WorkerSpec { worker_type: b"j2".to_vec(), id: b"w0".to_vec(), options_json: b"{}".to_vec(), timeout_s: 15 };
        let reg = node.register_worker(spec).await.expect("register");
        // The add of job 0, recorded for the versionstamp it got.
        on.store(true, Ordering::SeqCst);
        node.jobs().add(b"j2", &job_id(0), b"{\"n\":1}", 0).await.expect("add");
        on.store(false, Ordering::SeqCst);
        let add_stamp = log.lock().unwrap().iter().rev().find_map(|(_, info)| info.versionstamp).expect("add stamp");
        node.jobs().add(b"j2", &job_id(1), b"{\"n\":1}", 0).await.expect("add");
        log.lock().unwrap().clear();
        let before = store_contents(&db).await;

        on.store(true, Ordering::SeqCst);
        let handle = node.jobs().accept(b"j2", b"w0", Duration::from_secs(1)).await.expect("accept");
        let accept_stamp = log.lock().unwrap().iter().rev().find_map(|(_, info)| info.versionstamp);
        node.jobs().finish(&handle.fence(), b"{}").await.expect("finish");
        // The round arms its next watch after its commit: let it run.
        tokio::time::sleep(Duration::from_millis(200)).await;
        on.store(false, Ordering::SeqCst);
        drop(reg);

        let mut shape = Shape { marks: vec![job_id(0), add_stamp.to_vec()], ..Shape::default() };
        if let Some(s) = accept_stamp {
            shape.marks.push(s.to_vec());
        }
        let other = job_id(1);
        for (k, v) in before {
            if shape.marked(&k) {
                shape.per_job.push((k, v));
            } else if !k.windows(other.len()).any(|w| w == other.as_slice()) {
                shape.shared.push((k, v));
            }
        }
        let mut left_out = 0;
        for (tx, _) in log.lock().unwrap().drain(..) {
            // The node's services (promoter, reaper, membership) read
            // meanwhile, once a second or so, not per job: only the
            // writing transactions on the job's keys are the job's shape.
            let mentions_job = tx.writes_anything()
                && tx.ops.iter().any(|op| match op {
                    Op::Get(k) | Op::Set(k, _) | Op::Clear(k) | Op::StampKey(k, _) | Op::StampValue(k, _) => {
                        shape.marked(k)
                    }
                    _ => false,
                });
            if mentions_job {
                shape.txs.push(tx);
            } else {
                left_out += 1;
            }
        }
        (shape, left_out)
    });
    rt.block_on(node.stop());
    store.close();
    (shape, left_out)
}

async fn store_contents(db: &Db) -> Vec<KeyValue> {
    let tx = db.create_transaction(&TxOptions::read()).await.unwrap();
    tx.get_range(&RangeRequest::new(vec![0u8], vec![0xffu8])).await.unwrap()
}
