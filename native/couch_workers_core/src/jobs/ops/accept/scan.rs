//! The order in which a round reads the pending queue and offers its
//! jobs: queue order (spread after a failed attempt, [`super::spread`]),
//! the jobs that the node's other takes claimed last ([`super::Claims`]),
//! and reading on past jobs that no waiter of the round can hold, or
//! whose group runs as many jobs as it may (`max_running_per_group`: the
//! group is in the pending key's value, so passing over a full group's
//! jobs reads no record).
//!
//! What passing over costs is bounded per round: at most
//! [`SCAN_PAST_BYTES`] of pending keys and values read past, and one
//! counter read per group met. A full group with more queued jobs than
//! that at the head of the queue holds the waiters of other groups until
//! one of its runs ends (each end runs another round).

use std::collections::VecDeque;

use super::claims::Claimed;
use crate::jobs::limits::pending_group;
use super::spread;
use super::taking::Taking;
use crate::jobs::job::JobVs;
use crate::keyspace::Keyspace;
use crate::store::{RangeRequest, StoreError, Tx};

/// Most bytes of pending keys a round reads past those it offers its
/// waiters (left, as no waiter of the round can hold them, or stale):
/// then the waiters left wait for the queue to change.
pub const SCAN_PAST_BYTES: usize = 1_000_000;

/// Pending keys read at once when a round reads on past jobs it could not
/// give its waiters.
const PAGE_MIN: usize = 32;

/// Most keys ahead whose groups' counters a round reads at once with the
/// one it needs.
const GROUPS_AHEAD: usize = 64;

/// A pending key and what it says (`None`: not a key this code writes).
pub(super) type PendingKey = (Vec<u8>, Option<(i64, JobVs, Vec<u8>)>);

/// One round's read of the type's pending keys.
pub(super) struct Scan<'a> {
    ks: &'a Keyspace,
    job_type: &'a [u8],
    claims: Option<&'a Claimed<'a>>,
    end: Vec<u8>,
    /// Keys (and their values) read and not yet offered, in the order
    /// they will be.
    order: VecDeque<(Vec<u8>, Vec<u8>)>,
    /// The last key read (the next read starts after it).
    last: Option<Vec<u8>>,
    /// The last read reached the end of the queue.
    read_all: bool,
    /// Bytes of keys passed over (see [`SCAN_PAST_BYTES`]).
    passed: usize,
    /// Keys the node's other takes claimed, in queue order: offered
    /// after the other keys of their priority (before any key of a later
    /// one), and at the end.
    deferred: VecDeque<PendingKey>,
}

impl<'a> Scan<'a> {
    /// Reads the head of the queue: a key per waiter, the spread window
    /// ([`spread::window`] after `retries` failed attempts; the first
    /// window for a first attempt while the node's takes are contended),
    /// and as many keys as the node's other takes hold claimed.
    pub async fn start(
        tx: &Tx,
        ks: &'a Keyspace,
        job_type: &'a [u8],
        waiters: usize,
        retries: u32,
        claims: Option<&'a Claimed<'a>>,
    ) -> Result<Scan<'a>, StoreError> {
        let (begin, end) = ks.pending_range(job_type);
        let retries = if retries == 0 && claims.is_some_and(Claimed::contended) { 1 } else { retries };
        let window = spread::window(waiters, retries);
        let limit = waiters + window + claims.map_or(0, Claimed::others);
        let rows = tx.get_range(&RangeRequest::new(begin, end.clone()).limit(limit).snapshot(true)).await?;
        let read_all = rows.len() < limit;
        let last = rows.last().map(|(k, _)| k.clone());
        let order = spread::order(rows, window, |(k, _)| ks.parse_pending(job_type, k).map(|(p, _, _)| p));
        Ok(Scan { ks, job_type, claims, end, order, last, read_all, passed: 0, deferred: VecDeque::new() })
    }

    /// The next keys to offer, up to one per waiter still without a job
    /// (claimed for this take, but for the keys others claimed), reading
    /// on when those read are spent; empty when none is left. Keys whose
    /// active key is too long for every such waiter are passed over
    /// unread.
    pub async fn next_batch(&mut self, tx: &Tx, taking: &mut Taking<'_>) -> Result<Vec<PendingKey>, StoreError> {
        let (ks, job_type) = (self.ks, self.job_type);
        let mut batch = Vec::new();
        while batch.len() < taking.left() {
            if self.order.is_empty() && !self.refill(tx, taking.left()).await? {
                // Nothing else to read: the keys others claimed, last.
                self.offer_deferred(&mut batch, taking.left());
                break;
            }
            let Some((key, value)) = self.order.pop_front() else { break };
            let parsed = ks.parse_pending(job_type, &key);
            let later = match (&parsed, self.deferred.front()) {
                (Some((p, _, _)), Some((_, Some((q, _, _))))) => q < p,
                _ => false,
            };
            if later {
                // The claimed keys of an earlier priority come first.
                self.order.push_front((key, value));
                self.offer_deferred(&mut batch, taking.left());
                continue;
            }
            if let Some((_, _, id)) = &parsed {
                if !taking.key_fits(ks, job_type, id) {
                    self.passed(&key);
                    continue;
                }
            }
            if self.group_full(tx, taking, &value).await? {
                self.passed += value.len();
                self.passed(&key);
                continue;
            }
            if self.claims.is_some_and(|c| !c.claim(&key)) {
                self.deferred.push_back((key, parsed));
            } else {
                batch.push((key, parsed));
            }
        }
        Ok(batch)
    }

    /// Whether the pending job whose key has `value` is of a group that
    /// runs as many jobs as it may (reading the counters of its group and
    /// of the groups of the next keys, if not read yet). A value that
    /// names no group, or that this code does not write, is not held
    /// here (the offer checks the record's group).
    async fn group_full(&self, tx: &Tx, taking: &mut Taking<'_>, value: &[u8]) -> Result<bool, StoreError> {
        if !taking.limits.per_group() {
            return Ok(false);
        }
        let Ok(Some(group)) = pending_group(value) else { return Ok(false) };
        if !taking.limits.knows(&group) {
            let ahead = self.order.iter().take(GROUPS_AHEAD).filter_map(|(_, v)| pending_group(v).ok().flatten());
            let groups: Vec<Vec<u8>> = std::iter::once(group.clone()).chain(ahead).collect();
            taking.limits.load(tx, self.ks, self.job_type, groups).await?;
        }
        let full = taking.limits.group_full(&group);
        if full {
            taking.limits.held_back = true;
        }
        Ok(full)
    }

    /// Moves deferred keys into `batch` while it has room for `waiters`.
    fn offer_deferred(&mut self, batch: &mut Vec<PendingKey>, waiters: usize) {
        let room = waiters.saturating_sub(batch.len()).min(self.deferred.len());
        batch.extend(self.deferred.drain(..room));
    }

    /// Reads the next keys of the queue once those read are spent; false
    /// if none is left, or past [`SCAN_PAST_BYTES`].
    async fn refill(&mut self, tx: &Tx, waiters: usize) -> Result<bool, StoreError> {
        let Some(after) = self.last.take().filter(|_| !self.read_all && self.passed < SCAN_PAST_BYTES) else {
            return Ok(false);
        };
        // The first key after the last one read.
        let mut begin = after;
        begin.push(0);
        let limit = waiters.max(PAGE_MIN);
        let rows = tx.get_range(&RangeRequest::new(begin, self.end.clone()).limit(limit).snapshot(true)).await?;
        self.read_all = rows.len() < limit;
        self.last = rows.last().map(|(k, _)| k.clone());
        self.order.extend(rows);
        Ok(!self.order.is_empty())
    }

    /// `key` was offered and not taken (no waiter can hold it, or it was
    /// stale): counted as read past, and its claim released.
    pub fn passed(&mut self, key: &[u8]) {
        self.passed += key.len();
        if let Some(c) = self.claims {
            c.release(key);
        }
    }

    /// Every pending job was offered or passed over: none is left unread.
    pub fn read_all(&self) -> bool {
        self.read_all && self.order.is_empty() && self.deferred.is_empty()
    }
}
