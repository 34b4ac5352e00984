//! [`Overlaid`]: a [`Forwarded`] transaction that remembers what the calls
//! made in one caller's transaction wrote with versionstamps ([`Session`]),
//! so that a later call in the same transaction can read it back.
//!
//! FoundationDB refuses to read, in the transaction that wrote it, a key
//! set with a versionstamped value or any key a versionstamped key may
//! become (`accessed_unreadable`, 1036), and then fails that transaction's
//! commit. Job records are versionstamped values and pending keys are
//! versionstamped keys, so without this a job added in a caller's
//! transaction could not be read (`job_get/3`), nor an updated one finished,
//! in the same transaction. The session answers such reads itself, as
//! FoundationDB would once the placeholder is filled: a record read back
//! holds an incomplete versionstamp (`jobs::record::is_incomplete`), and is
//! written again with a fresh placeholder.
//!
//! One more case needs care: clearing a versionstamped key the session
//! wrote (a job added, then canceled or removed in the same transaction).
//! Its final bytes are known only at the commit, so the clear becomes a
//! clear of every key it may become (the placeholder filled with a version
//! after the read version, up to one of `0xff`), with that range in the
//! transaction's read conflict set: any other key in that range was
//! committed after the read version, and then the caller's commit fails
//! and is retried, so that the clear only ever removes the session's own
//! key.
//!
//! A session belongs to one attempt of one transaction: the caller keeps
//! one per transaction and read version (a retried attempt reads at a new
//! version) and passes it to every call.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

use super::forward::Forwarded;
use super::mutation::{fill_versionstamp, split_versionstamp_param, versionstamp};
use super::{CommitInfo, KeyValue, RangeRequest, StoreError, Transaction, Watch, VERSIONSTAMP_LEN};

/// What the session's writes made of a key it set with a versionstamped
/// value.
#[derive(Debug, Clone)]
enum Known {
    /// Its value (the placeholder an incomplete versionstamp).
    Value(Vec<u8>),
    Cleared,
    /// An atomic operation changed it: only the commit knows.
    Unknown,
}

#[derive(Debug, Default)]
struct Written {
    values: HashMap<Vec<u8>, Known>,
    /// Versionstamped keys: the bytes without the offset, and the offset.
    keys: Vec<(Vec<u8>, usize)>,
}

/// The versionstamped writes of the calls made so far in one attempt of a
/// caller's transaction.
#[derive(Debug)]
pub struct Session {
    read_version: u64,
    written: Mutex<Written>,
}

impl Session {
    /// A session for the attempt that reads at `read_version`.
    pub fn new(read_version: u64) -> Arc<Session> {
        Arc::new(Session { read_version, written: Mutex::new(Written::default()) })
    }

    fn lock(&self) -> MutexGuard<'_, Written> {
        self.written.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `[begin, end)`: every key the versionstamped key may become, from
    /// the version after `after`.
    fn key_range(bytes: &[u8], offset: usize, after: u64) -> (Vec<u8>, Vec<u8>) {
        let begin = fill_versionstamp(bytes, offset, &versionstamp(after.saturating_add(1)));
        let mut end = fill_versionstamp(bytes, offset, &[0xff; VERSIONSTAMP_LEN]);
        end.push(0);
        (begin, end)
    }

    /// Whether FoundationDB would refuse reading `[begin, end)` (a key
    /// with a value or an atomic operation of the session's, or a key a
    /// versionstamped key may become).
    fn overlaps(&self, w: &Written, begin: &[u8], end: &[u8]) -> bool {
        let values = w.values.iter().any(|(k, known)| {
            !matches!(known, Known::Cleared) && begin <= k.as_slice() && k.as_slice() < end
        });
        values
            || w.keys.iter().any(|(bytes, offset)| {
                // From the read version itself, as FoundationDB counts.
                let (b, e) = Session::key_range(bytes, *offset, self.read_version.saturating_sub(1));
                b.as_slice() < end && begin < e.as_slice()
            })
    }
}

/// The forwarding transaction of one call, with its session.
pub struct Overlaid {
    inner: Forwarded,
    session: Arc<Session>,
}

impl Overlaid {
    pub fn new(inner: Forwarded, session: Arc<Session>) -> Overlaid {
        Overlaid { inner, session }
    }
}

#[async_trait]
impl Transaction for Overlaid {
    async fn get(&self, key: &[u8], snapshot: bool) -> Result<Option<Vec<u8>>, StoreError> {
        {
            let w = self.session.lock();
            match w.values.get(key) {
                Some(Known::Value(v)) => return Ok(Some(v.clone())),
                Some(Known::Cleared) => return Ok(None),
                Some(Known::Unknown) => return Err(StoreError::accessed_unreadable()),
                None => {}
            }
            let mut end = key.to_vec();
            end.push(0);
            if self.session.overlaps(&w, key, &end) {
                return Err(StoreError::accessed_unreadable());
            }
        }
        self.inner.get(key, snapshot).await
    }

    async fn get_range(&self, range: &RangeRequest) -> Result<Vec<KeyValue>, StoreError> {
        if self.session.overlaps(&self.session.lock(), &range.begin, &range.end) {
            return Err(StoreError::accessed_unreadable());
        }
        self.inner.get_range(range).await
    }

    async fn read_version(&self) -> Result<u64, StoreError> {
        self.inner.read_version().await
    }

    fn set(&self, key: &[u8], value: &[u8]) {
        if let Some(known) = self.session.lock().values.get_mut(key) {
            *known = Known::Value(value.to_vec());
        }
        self.inner.set(key, value);
    }

    fn clear(&self, key: &[u8]) {
        // A versionstamped key stays in the session after its clear: reads
        // of the range it may become are still refused here, as
        // FoundationDB still refuses them (its unreadable ranges stay).
        let stamped = {
            let mut w = self.session.lock();
            if let Some(known) = w.values.get_mut(key) {
                *known = Known::Cleared;
            }
            w.keys.iter().find(|(bytes, _)| bytes.as_slice() == key).cloned()
        };
        match stamped {
            Some((bytes, offset)) => {
                let (begin, end) = Session::key_range(&bytes, offset, self.session.read_version);
                self.inner.add_read_conflict_range(&begin, &end);
                self.inner.clear_range(&begin, &end);
            }
            None => self.inner.clear(key),
        }
    }

    fn clear_range(&self, begin: &[u8], end: &[u8]) {
        for (k, known) in self.session.lock().values.iter_mut() {
            if begin <= k.as_slice() && k.as_slice() < end {
                *known = Known::Cleared;
            }
        }
        self.inner.clear_range(begin, end);
    }

    fn atomic_add(&self, key: &[u8], delta: i64) {
        if let Some(known) = self.session.lock().values.get_mut(key) {
            *known = Known::Unknown;
        }
        self.inner.atomic_add(key, delta);
    }

    fn atomic_byte_max(&self, key: &[u8], value: &[u8]) {
        if let Some(known) = self.session.lock().values.get_mut(key) {
            *known = Known::Unknown;
        }
        self.inner.atomic_byte_max(key, value);
    }

    fn set_versionstamped_key(&self, key: &[u8], value: &[u8]) {
        if let Ok((bytes, offset)) = split_versionstamp_param(key) {
            self.session.lock().keys.push((bytes.to_vec(), offset));
        }
        self.inner.set_versionstamped_key(key, value);
    }

    fn set_versionstamped_value(&self, key: &[u8], value: &[u8]) {
        if let Ok((bytes, _)) = split_versionstamp_param(value) {
            self.session.lock().values.insert(key.to_vec(), Known::Value(bytes.to_vec()));
        }
        self.inner.set_versionstamped_value(key, value);
    }

    fn add_read_conflict_key(&self, key: &[u8]) {
        self.inner.add_read_conflict_key(key);
    }

    fn watch(&self, key: &[u8]) -> Watch {
        self.inner.watch(key)
    }

    async fn commit(&self) -> Result<CommitInfo, StoreError> {
        self.inner.commit().await
    }

    async fn on_error(&self, err: StoreError) -> Result<(), StoreError> {
        self.inner.on_error(err).await
    }
}
