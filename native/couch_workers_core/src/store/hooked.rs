//! A forwarding [`Transaction`] for tests: every call goes to the wrapped
//! transaction, after a hook has seen it. A test that needs to watch or
//! steer one transaction (count the bytes it writes, script a fault for
//! the commit that clears a given key) writes the hooks it needs instead
//! of the whole trait's forwarding again.
//!
//! Not for production: like `faulty.rs`, it ships only with the `testkit`
//! feature.

use async_trait::async_trait;

use super::{CommitInfo, KeyValue, RangeRequest, StoreError, Transaction, Tx, Watch};

/// One write, as a hook sees it before the wrapped transaction does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write<'a> {
    Set { key: &'a [u8], value: &'a [u8] },
    Clear { key: &'a [u8] },
    ClearRange { begin: &'a [u8], end: &'a [u8] },
    AtomicAdd { key: &'a [u8], delta: i64 },
    AtomicByteMax { key: &'a [u8], value: &'a [u8] },
    SetVersionstampedKey { key: &'a [u8], value: &'a [u8] },
    SetVersionstampedValue { key: &'a [u8], value: &'a [u8] },
}

impl Write<'_> {
    /// The bytes the write counts against the transaction size limit
    /// ([`MAX_TRANSACTION_SIZE`](crate::store::MAX_TRANSACTION_SIZE)), as
    /// the stores count them: key and value, a range's two ends, an add's
    /// key and its 8 bytes.
    pub fn size(&self) -> usize {
        match *self {
            Write::Set { key, value }
            | Write::AtomicByteMax { key, value }
            | Write::SetVersionstampedKey { key, value }
            | Write::SetVersionstampedValue { key, value } => key.len() + value.len(),
            Write::Clear { key } => key.len(),
            Write::ClearRange { begin, end } => begin.len() + end.len(),
            Write::AtomicAdd { key, .. } => key.len() + 8,
        }
    }
}

/// What a test runs around the wrapped transaction's calls. Every hook
/// does nothing unless the test says otherwise; reads, watches and read
/// conflict keys are forwarded unhooked.
pub trait TxHooks: Send + Sync + 'static {
    /// Before the write reaches the wrapped transaction.
    fn write(&self, _write: Write<'_>) {}
    /// Before the commit reaches the wrapped transaction.
    fn commit(&self) {}
    /// Before `on_error` reaches the wrapped transaction.
    fn on_error(&self, _err: &StoreError) {}
}

/// The wrapped transaction and its hooks.
pub struct Hooked<H> {
    inner: Tx,
    hooks: H,
}

impl<H: TxHooks> Hooked<H> {
    pub fn new(inner: Tx, hooks: H) -> Self {
        Hooked { inner, hooks }
    }

    /// The hooks, for what they recorded.
    pub fn hooks(&self) -> &H {
        &self.hooks
    }
}

#[async_trait]
impl<H: TxHooks> Transaction for Hooked<H> {
    async fn get(&self, key: &[u8], snapshot: bool) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(key, snapshot).await
    }
    async fn get_range(&self, range: &RangeRequest) -> Result<Vec<KeyValue>, StoreError> {
        self.inner.get_range(range).await
    }
    async fn read_version(&self) -> Result<u64, StoreError> {
        self.inner.read_version().await
    }
    fn set(&self, key: &[u8], value: &[u8]) {
        self.hooks.write(Write::Set { key, value });
        self.inner.set(key, value)
    }
    fn clear(&self, key: &[u8]) {
        self.hooks.write(Write::Clear { key });
        self.inner.clear(key)
    }
    fn clear_range(&self, begin: &[u8], end: &[u8]) {
        self.hooks.write(Write::ClearRange { begin, end });
        self.inner.clear_range(begin, end)
    }
    fn atomic_add(&self, key: &[u8], delta: i64) {
        self.hooks.write(Write::AtomicAdd { key, delta });
        self.inner.atomic_add(key, delta)
    }
    fn atomic_byte_max(&self, key: &[u8], value: &[u8]) {
        self.hooks.write(Write::AtomicByteMax { key, value });
        self.inner.atomic_byte_max(key, value)
    }
    fn set_versionstamped_key(&self, key: &[u8], value: &[u8]) {
        self.hooks.write(Write::SetVersionstampedKey { key, value });
        self.inner.set_versionstamped_key(key, value)
    }
    fn set_versionstamped_value(&self, key: &[u8], value: &[u8]) {
        self.hooks.write(Write::SetVersionstampedValue { key, value });
        self.inner.set_versionstamped_value(key, value)
    }
    fn add_read_conflict_key(&self, key: &[u8]) {
        self.inner.add_read_conflict_key(key)
    }
    fn watch(&self, key: &[u8]) -> Watch {
        self.inner.watch(key)
    }
    fn spare_own_watches(&self, key: &[u8]) {
        self.inner.spare_own_watches(key)
    }
    async fn commit(&self) -> Result<CommitInfo, StoreError> {
        self.hooks.commit();
        self.inner.commit().await
    }
    async fn on_error(&self, err: StoreError) -> Result<(), StoreError> {
        self.hooks.on_error(&err);
        self.inner.on_error(err).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::store::sim::{SimOptions, SimStore};
    use crate::store::{Database, TxOptions};

    #[derive(Default)]
    struct Record(Mutex<Vec<String>>);

    impl TxHooks for Arc<Record> {
        fn write(&self, write: Write<'_>) {
            self.0.lock().unwrap().push(format!("write {}", write.size()));
        }
        fn commit(&self) {
            self.0.lock().unwrap().push("commit".into());
        }
        fn on_error(&self, err: &StoreError) {
            self.0.lock().unwrap().push(format!("on_error {err:?}"));
        }
    }

    #[tokio::test]
    async fn every_call_reaches_the_hooks_then_the_wrapped_transaction() {
        let sim = SimStore::new(SimOptions::new(1));
        let record = Arc::new(Record::default());
        let inner = sim.create_transaction(&TxOptions::write()).await.unwrap();
        let tx = Hooked::new(inner, record.clone());
        tx.set(b"k", b"vv");
        tx.clear(b"c");
        tx.clear_range(b"a", b"b");
        tx.atomic_add(b"n", 1);
        tx.atomic_byte_max(b"m", b"x");
        assert_eq!(tx.get(b"k", false).await.unwrap(), Some(b"vv".to_vec()), "forwarded: read its own write");
        assert_eq!(tx.get(b"n", false).await.unwrap(), Some(1i64.to_le_bytes().to_vec()));
        tx.commit().await.unwrap();
        tx.on_error(StoreError::Conflict).await.unwrap();
        assert_eq!(
            *record.0.lock().unwrap(),
            ["write 3", "write 1", "write 2", "write 9", "write 2", "commit", "on_error Conflict"],
        );
        let check = sim.create_transaction(&TxOptions::read()).await.unwrap();
        assert_eq!(check.get(b"k", false).await.unwrap(), Some(b"vv".to_vec()), "committed through the wrapper");
    }
}
