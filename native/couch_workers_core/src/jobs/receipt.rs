//! Receipts: how a job write answers for itself after
//! `commit_unknown_result`.
//!
//! FoundationDB may answer 1021 for a commit that happened, and the retry
//! loop runs the body again. For most job writes the state alone cannot
//! tell "my earlier attempt did this" from "someone else did": a job that
//! exists may be another caller's `add`, a finished job may have been
//! finished by this call or taken away and finished by another worker. So
//! each write draws a random token outside the retry loop and, when it
//! writes anything, also sets the receipt key of that token in the same
//! transaction. An attempt that follows one which may have committed
//! (`Attempt::may_have_committed`) reads the receipt first: present, the
//! earlier attempt landed, and the call answers as that attempt would
//! have, writing nothing more. Reaps and the node's removals and
//! replacements of workers set one too, holding how many jobs they failed
//! over ([`count_outcome`]): their retry finds the worker gone either way.
//! A heartbeat that registers a reaped worker again sets one naming the
//! registrations it reinstated (`services/heartbeat.rs`): its retry finds
//! them registered, and their owners must still be told.
//!
//! Only on stores whose commits may answer `commit_unknown_result`
//! (`Database::commits_may_be_unknown`: FoundationDB, `sim`, the faulty
//! test wrapper); the embedded store knows every commit's outcome and
//! writes none. Cost: one small key (about 50 bytes) set per job write and
//! no extra read on a first attempt (figures in bench/RESULTS.md). Cleanup: each node's pruner clears, with one
//! blind range clear a minute, every receipt written more than
//! [`KEEP_MINUTES`] minutes ago by the writer's clock (far longer than any
//! call's retry budget; a writer whose clock lags by more than that may
//! lose its receipt early, and then answers as without one).

use rand::RngCore;

use crate::keyspace::Keyspace;
use crate::store::{StoreError, Tx};

/// How long a receipt is kept, in minutes of the writer's wall clock.
pub const KEEP_MINUTES: i64 = 10;

/// What a landed write reported.
pub const DONE: &[u8] = b"done";
/// An update that found a cancel request and wrote the cancellation.
pub const CANCELED: &[u8] = b"canceled";

/// A landed write that moved `n` jobs (a reap, an owner's exit, a
/// replacing registration): what it failed over, for the node's metrics.
pub fn count_outcome(n: usize) -> [u8; 8] {
    u64::try_from(n).unwrap_or(u64::MAX).to_be_bytes()
}

/// The count of a [`count_outcome`] (0 for any other outcome).
pub fn parse_count(outcome: &[u8]) -> usize {
    <[u8; 8]>::try_from(outcome).map_or(0, |b| usize::try_from(u64::from_be_bytes(b)).unwrap_or(usize::MAX))
}

/// The current Unix minute of this node's wall clock.
pub fn minute_now() -> i64 {
    (super::place::wall_ms() / 60_000) as i64
}

/// One call's receipt: the same key on every attempt of the call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    key: Vec<u8>,
}

impl Receipt {
    /// A fresh receipt for one call (draw it outside the retry loop).
    pub fn new(ks: &Keyspace) -> Receipt {
        let mut token = [0u8; 16];
        rand::rng().fill_bytes(&mut token);
        Receipt { key: ks.receipt(minute_now(), &token) }
    }

    /// What the earlier attempt that wrote this receipt reported, if one
    /// did. Not a snapshot read: a receipt being written concurrently
    /// (the earlier attempt still in flight) makes this attempt conflict.
    pub async fn landed(&self, tx: &Tx) -> Result<Option<Vec<u8>>, StoreError> {
        tx.get(&self.key, false).await
    }

    /// Records, in the write's own transaction, that it wrote and what it
    /// reported.
    pub fn write(&self, tx: &Tx, outcome: &[u8]) {
        tx.set(&self.key, outcome);
    }

    pub fn key(&self) -> &[u8] {
        &self.key
    }
}

/// Clears every receipt older than [`KEEP_MINUTES`] by `minute`.
pub fn clear_old(tx: &Tx, ks: &Keyspace, minute: i64) {
    let (begin, end) = ks.receipts_before(minute - KEEP_MINUTES);
    tx.clear_range(&begin, &end);
}
