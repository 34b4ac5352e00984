//! [`Forwarded`]: a [`Transaction`] that someone else owns and commits.
//!
//! CouchDB calls its job queue inside its own FoundationDB transactions
//! (couch_jobs takes a `Tx`): the job's writes must land iff the caller's
//! transaction commits, and its reads must join the caller's conflict set.
//! So the key-space operations (`jobs::ops`) run unchanged on this
//! transaction, which forwards every call, in order, through a channel:
//!
//! * reads (`get`, `get_range`, `read_version`) send a [`Request`] with an
//!   id and wait for its [`Answer`], given back through [`Answers`];
//! * writes send a [`Request`] and wait for nothing (as FoundationDB's
//!   writes, whose errors surface at the next read or at the commit: here,
//!   in the owner's transaction);
//! * `watch` is refused: a watch is armed by a commit this side never sees
//!   (no operation that runs here needs one);
//! * `commit` and `on_error` are refused: the owner commits and retries.
//!
//! Every request (reads and writes) has the next id of one sequence, so
//! the owner can apply them in the order they were made whatever order its
//! transport delivers them in. The store knows nothing of who the owner is:
//! the NIF relays the requests to an Erlang process that performs them on
//! an erlfdb transaction.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};

use super::{CommitInfo, KeyValue, RangeRequest, StoreError, Transaction, Watch};

/// One call of the forwarded transaction, for its owner to perform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Get {
        key: Vec<u8>,
        snapshot: bool,
    },
    GetRange(RangeRequest),
    ReadVersion,
    Set {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Clear {
        key: Vec<u8>,
    },
    ClearRange {
        begin: Vec<u8>,
        end: Vec<u8>,
    },
    /// FoundationDB's ADD with `param` (a little-endian i64).
    AtomicAdd {
        key: Vec<u8>,
        param: [u8; 8],
    },
    AtomicByteMax {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    /// `key` in API-520 form (placeholder, then its 4-byte LE offset).
    SetVersionstampedKey {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    /// `value` in API-520 form.
    SetVersionstampedValue {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    AddReadConflictKey {
        key: Vec<u8>,
    },
    /// `[begin, end)` into the read conflict set (`store::overlay`'s clear
    /// of a versionstamped key its session wrote).
    AddReadConflictRange {
        begin: Vec<u8>,
        end: Vec<u8>,
    },
}

impl Request {
    /// Whether the request waits for an [`Answer`].
    pub fn is_read(&self) -> bool {
        matches!(self, Request::Get { .. } | Request::GetRange(_) | Request::ReadVersion)
    }
}

/// A request and its place in the transaction's sequence of calls (0, 1,
/// 2, ...); a read's answer names the same id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub id: u64,
    pub request: Request,
}

/// The owner's answer to a read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Value(Option<Vec<u8>>),
    Range(Vec<KeyValue>),
    Version(u64),
    /// The read failed in the owner's transaction (a conflict surfacing
    /// early, `transaction_too_old`, ...): the operation ends with it.
    Failed(StoreError),
}

/// A FoundationDB error code as the store's error: the codes the `fdb`
/// store names (`store::fdb::map_fdb_error`), else `Fdb { code }`. Whether
/// it is retried is the owner's decision (its own retry loop), never this
/// side's, so `retryable` is false.
pub fn fdb_code_error(code: i32) -> StoreError {
    match code {
        1020 => StoreError::Conflict,
        1007 => StoreError::TooOld,
        1021 => StoreError::CommitUnknown,
        1031 => StoreError::TimedOut,
        2101 => StoreError::TransactionTooLarge,
        2102 => StoreError::KeyTooLarge,
        2103 => StoreError::ValueTooLarge,
        code => StoreError::Fdb {
            code,
            message: format!("FoundationDB error {code} in the caller's transaction"),
            retryable: false,
        },
    }
}

/// The reads waiting for an answer, shared by the transaction and its
/// [`Answers`].
#[derive(Default)]
struct Pending {
    waiting: HashMap<u64, oneshot::Sender<Answer>>,
    /// The owner is gone: no read will be answered.
    closed: bool,
}

/// Where the owner's answers go. Dropping it (or [`Answers::close`]) fails
/// every read still waiting, and every later one, with
/// [`StoreError::Closed`]: an owner that dies never leaves the operation
/// waiting.
pub struct Answers {
    pending: Arc<Mutex<Pending>>,
}

impl Answers {
    /// Delivers the answer to read `id`. False if no read `id` waits (a
    /// write's id, an id answered already, or an operation that ended).
    pub fn answer(&self, id: u64, answer: Answer) -> bool {
        let waiter = lock(&self.pending).waiting.remove(&id);
        waiter.is_some_and(|w| w.send(answer).is_ok())
    }

    /// The owner will answer nothing more.
    pub fn close(&self) {
        let mut pending = lock(&self.pending);
        pending.closed = true;
        pending.waiting.clear();
    }
}

impl Drop for Answers {
    fn drop(&mut self) {
        self.close();
    }
}

fn lock(pending: &Mutex<Pending>) -> MutexGuard<'_, Pending> {
    pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The sending end: the next id and the channel, under one lock so that
/// ids follow the channel's order.
struct Outbox {
    next_id: u64,
    tx: mpsc::UnboundedSender<Sent>,
}

/// The forwarding transaction (see the module comment).
pub struct Forwarded {
    outbox: Mutex<Outbox>,
    pending: Arc<Mutex<Pending>>,
}

/// A forwarding transaction, the requests it makes (in id order), and
/// where their answers go.
pub fn channel() -> (Forwarded, mpsc::UnboundedReceiver<Sent>, Answers) {
    let (tx, rx) = mpsc::unbounded_channel();
    let pending = Arc::new(Mutex::new(Pending::default()));
    let forwarded = Forwarded { outbox: Mutex::new(Outbox { next_id: 0, tx }), pending: pending.clone() };
    (forwarded, rx, Answers { pending })
}

impl Forwarded {
    /// Sends `request` with the next id; a read also registers its waiter
    /// (before the send, so that no answer can come first).
    fn send(&self, request: Request, waiter: Option<oneshot::Sender<Answer>>) -> Result<(), StoreError> {
        let mut outbox = self.outbox.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let id = outbox.next_id;
        if let Some(waiter) = waiter {
            let mut pending = lock(&self.pending);
            if pending.closed {
                return Err(StoreError::Closed);
            }
            pending.waiting.insert(id, waiter);
        }
        outbox.next_id += 1;
        // A closed channel: the owner stopped listening; a read then finds
        // its waiter dropped, and a write is lost with the owner's
        // transaction, which will not commit what it never received.
        let _ = outbox.tx.send(Sent { id, request });
        Ok(())
    }

    async fn read(&self, request: Request) -> Result<Answer, StoreError> {
        let (waiter, answer) = oneshot::channel();
        self.send(request, Some(waiter))?;
        match answer.await {
            Ok(Answer::Failed(err)) => Err(err),
            Ok(answer) => Ok(answer),
            Err(_) => Err(StoreError::Closed),
        }
    }

    fn write(&self, request: Request) {
        // Writes register no waiter, so `send` cannot fail for them.
        let _ = self.send(request, None);
    }

    /// Adds `[begin, end)` to the owner's read conflict set.
    pub(crate) fn add_read_conflict_range(&self, begin: &[u8], end: &[u8]) {
        self.write(Request::AddReadConflictRange { begin: begin.to_vec(), end: end.to_vec() });
    }
}

fn wrong_answer(asked: &str, answer: &Answer) -> StoreError {
    StoreError::Invalid(format!("the caller's transaction answered a {asked} with {answer:?}"))
}

#[async_trait]
impl Transaction for Forwarded {
    async fn get(&self, key: &[u8], snapshot: bool) -> Result<Option<Vec<u8>>, StoreError> {
        match self.read(Request::Get { key: key.to_vec(), snapshot }).await? {
            Answer::Value(value) => Ok(value),
            other => Err(wrong_answer("get", &other)),
        }
    }

    async fn get_range(&self, range: &RangeRequest) -> Result<Vec<KeyValue>, StoreError> {
        match self.read(Request::GetRange(range.clone())).await? {
            Answer::Range(rows) => Ok(rows),
            other => Err(wrong_answer("get_range", &other)),
        }
    }

    async fn read_version(&self) -> Result<u64, StoreError> {
        match self.read(Request::ReadVersion).await? {
            Answer::Version(version) => Ok(version),
            other => Err(wrong_answer("read_version", &other)),
        }
    }

    fn set(&self, key: &[u8], value: &[u8]) {
        self.write(Request::Set { key: key.to_vec(), value: value.to_vec() });
    }

    fn clear(&self, key: &[u8]) {
        self.write(Request::Clear { key: key.to_vec() });
    }

    fn clear_range(&self, begin: &[u8], end: &[u8]) {
        self.write(Request::ClearRange { begin: begin.to_vec(), end: end.to_vec() });
    }

    fn atomic_add(&self, key: &[u8], delta: i64) {
        self.write(Request::AtomicAdd { key: key.to_vec(), param: delta.to_le_bytes() });
    }

    fn atomic_byte_max(&self, key: &[u8], value: &[u8]) {
        self.write(Request::AtomicByteMax { key: key.to_vec(), value: value.to_vec() });
    }

    fn set_versionstamped_key(&self, key: &[u8], value: &[u8]) {
        self.write(Request::SetVersionstampedKey { key: key.to_vec(), value: value.to_vec() });
    }

    fn set_versionstamped_value(&self, key: &[u8], value: &[u8]) {
        self.write(Request::SetVersionstampedValue { key: key.to_vec(), value: value.to_vec() });
    }

    fn add_read_conflict_key(&self, key: &[u8]) {
        self.write(Request::AddReadConflictKey { key: key.to_vec() });
    }

    fn watch(&self, _key: &[u8]) -> Watch {
        Box::pin(async { Err(StoreError::Invalid("no watch in a caller's transaction".into())) })
    }

    async fn commit(&self) -> Result<CommitInfo, StoreError> {
        Err(StoreError::Invalid("a caller's transaction is committed by the caller".into()))
    }

    async fn on_error(&self, err: StoreError) -> Result<(), StoreError> {
        // The caller's retry loop retries; this side never does.
        Err(err)
    }
}
