//! Armed watches of a simulated cluster, and each handle's count of
//! outstanding watches (FDB's `too_many_watches` limit, 10,000 per
//! database handle).
//!
//! A watch is armed when its transaction commits, with the value that
//! transaction saw; it fires once a commit leaves the key with another
//! value (or at once, if one already did), and may fire spuriously.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::store::StoreError;

/// FoundationDB's default `MAX_WATCHES` per database handle.
pub const MAX_WATCHES: usize = 10_000;

pub(super) type WatchSender = oneshot::Sender<Result<(), StoreError>>;

/// `too_many_watches` (1032).
pub(super) fn too_many_watches() -> StoreError {
    StoreError::Fdb { code: 1032, message: "too_many_watches".into(), retryable: false }
}

/// What a watch of a transaction that never committed resolves to
/// (FDB: `transaction_cancelled`, 1025).
pub(super) fn transaction_cancelled() -> StoreError {
    StoreError::Fdb {
        code: 1025,
        message: "transaction_cancelled: the watch's transaction did not commit".into(),
        retryable: false,
    }
}

/// What every armed watch resolves to at a recovery (the sim's choice;
/// FDB's client may also re-arm a watch itself, so callers must handle
/// both): `operation_cancelled` (1101).
pub(super) fn lost_in_recovery() -> StoreError {
    StoreError::Fdb {
        code: 1101,
        message: "operation_cancelled: watch lost in a cluster recovery".into(),
        retryable: false,
    }
}

/// Outstanding watches of one handle: counted from `watch()` until the
/// watch resolves or is dropped.
#[derive(Debug, Default)]
pub(super) struct WatchCount(AtomicUsize);

impl WatchCount {
    /// Counts one more watch, unless the handle has [`MAX_WATCHES`].
    pub(super) fn acquire(self: &Arc<Self>) -> Option<WatchSlot> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < MAX_WATCHES).then_some(n + 1))
            .ok()
            .map(|_| WatchSlot(self.clone()))
    }

    pub(super) fn get(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

/// One counted watch; uncounted on drop.
#[derive(Debug)]
pub(super) struct WatchSlot(Arc<WatchCount>);

impl Drop for WatchSlot {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::AcqRel);
    }
}

struct Armed {
    handle: u64,
    expected: Option<Vec<u8>>,
    tx: WatchSender,
}

/// The armed watches of one cluster, by key.
#[derive(Default)]
pub(super) struct WatchRegistry {
    by_key: BTreeMap<Vec<u8>, Vec<Armed>>,
    armed_since_sweep: usize,
}

impl std::fmt::Debug for WatchRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchRegistry").field("armed", &self.len()).finish()
    }
}

impl WatchRegistry {
    /// Arms a watch of `handle` on `key` that saw `expected`; `current` is
    /// the key's value now.
    pub(super) fn arm(
        &mut self,
        handle: u64,
        key: Vec<u8>,
        expected: Option<Vec<u8>>,
        current: Option<Vec<u8>>,
        tx: WatchSender,
    ) {
        if expected != current {
            let _ = tx.send(Ok(()));
            return;
        }
        self.by_key.entry(key).or_default().push(Armed { handle, expected, tx });
        self.armed_since_sweep += 1;
        if self.armed_since_sweep >= 1024 {
            self.sweep();
        }
    }

    /// Drops the watches nobody waits for any more.
    fn sweep(&mut self) {
        self.armed_since_sweep = 0;
        self.by_key.retain(|_, armed| {
            armed.retain(|a| !a.tx.is_closed());
            !armed.is_empty()
        });
    }

    /// After a commit changed `key` to `value`: fires the watches that saw
    /// another value.
    pub(super) fn changed(&mut self, key: &[u8], value: &Option<Vec<u8>>) {
        let Some(armed) = self.by_key.get_mut(key) else { return };
        let (fire, keep): (Vec<Armed>, Vec<Armed>) =
            std::mem::take(armed).into_iter().partition(|a| &a.expected != value || a.tx.is_closed());
        for a in fire {
            let _ = a.tx.send(Ok(()));
        }
        if keep.is_empty() {
            self.by_key.remove(key);
        } else {
            *self.by_key.get_mut(key).expect("entry") = keep;
        }
    }

    /// Keys in `[begin, end)` that have armed watches.
    pub(super) fn keys_in(&self, begin: &[u8], end: &[u8]) -> Vec<Vec<u8>> {
        if begin >= end {
            return Vec::new();
        }
        self.by_key.range(begin.to_vec()..end.to_vec()).map(|(k, _)| k.clone()).collect()
    }

    pub(super) fn len(&self) -> usize {
        self.by_key.values().map(Vec::len).sum()
    }

    /// Fires the `n`-th armed watch (in key order) although nothing changed.
    pub(super) fn fire_spuriously(&mut self, n: usize) {
        let mut left = n;
        let mut hit = None;
        for (k, armed) in &self.by_key {
            if left < armed.len() {
                hit = Some((k.clone(), left));
                break;
            }
            left -= armed.len();
        }
        if let Some((k, i)) = hit {
            let armed = self.by_key.get_mut(&k).expect("entry");
            let a = armed.remove(i);
            let _ = a.tx.send(Ok(()));
            if armed.is_empty() {
                self.by_key.remove(&k);
            }
        }
    }

    /// Fails every watch of `handle` (`None`: of every handle) with `err`.
    pub(super) fn fail(&mut self, handle: Option<u64>, err: &StoreError) {
        self.by_key.retain(|_, armed| {
            let (fail, keep): (Vec<Armed>, Vec<Armed>) =
                std::mem::take(armed).into_iter().partition(|a| handle.is_none_or(|h| h == a.handle));
            for a in fail {
                let _ = a.tx.send(Err(err.clone()));
            }
            *armed = keep;
            !armed.is_empty()
        });
    }
}
