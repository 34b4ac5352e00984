//! Removing ended jobs past their `keep`, and the running counters of
//! groups that run nothing.

use super::helpers::read_record;
use super::lifecycle::remove_record;
use crate::keyspace::Keyspace;
use crate::store::{RangeRequest, StoreError, Tx};

/// What one pruning transaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pruned {
    /// The jobs removed, `(type, id)`.
    pub removed: Vec<(Vec<u8>, Vec<u8>)>,
    /// The earliest expiry left (Unix ms); due now if the batch was full.
    pub next: Option<u64>,
}

/// The earliest expiry (Unix ms), read as a snapshot: whether a prune is
/// due at all, without a write transaction.
pub async fn next_expiry(tx: &Tx, ks: &Keyspace) -> Result<Option<u64>, StoreError> {
    let (begin, end) = ks.expiry_range();
    let rows = tx.get_range(&RangeRequest::new(begin, end).limit(1).snapshot(true)).await?;
    Ok(rows.first().and_then(|(k, _)| ks.parse_expiry(k)).map(|(at, _, _)| u64::try_from(at).unwrap_or(0)))
}

/// Removes up to `limit` ended jobs whose `keep` ran out by `now`, in
/// expiry order. Several nodes may prune at once: each removal re-reads
/// the record in the transaction, and conflicting prunes retry.
pub async fn prune(tx: &Tx, ks: &Keyspace, now: u64, limit: usize) -> Result<Pruned, StoreError> {
    let (begin, end) = ks.expiry_range();
    let rows = tx.get_range(&RangeRequest::new(begin, end).limit(limit + 1)).await?;
    let mut out = Pruned::default();
    for (key, _) in &rows {
        let Some((at, job_type, id)) = ks.parse_expiry(key) else {
            tx.clear(key);
            continue;
        };
        let at = u64::try_from(at).unwrap_or(0);
        if at > now || out.removed.len() == limit {
            out.next = Some(at.min(if out.removed.len() == limit { now } else { at }));
            break;
        }
        match read_record(tx, ks, &job_type, &id, false).await? {
            Some(rec) if rec.state.is_terminal() && rec.expire_at == Some(at) => {
                remove_record(tx, ks, &job_type, &id, &rec);
                out.removed.push((job_type, id));
            }
            _ => tx.clear(key),
        }
    }
    Ok(out)
}

/// What one sweep of the groups' running counters did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupsSwept {
    /// Counters cleared (back at 0: the group runs nothing).
    pub cleared: usize,
    /// Where the next sweep goes on: the last key looked at, or `None`
    /// when this one reached the end.
    pub next: Option<Vec<u8>>,
}

/// Clears up to `limit` groups' running counters (`jobs/limits.rs`) that
/// are back at 0, looking at the keys after `after` (from the first with
/// `None`). Without it every group that ever ran keeps its counter key.
/// The counters are read as a snapshot and a read conflict is added on
/// each one cleared only: a run of that group starting meanwhile (its +1
/// committed after this read) makes this transaction conflict and retry,
/// so no count is lost, and a counter cleared first is simply added to
/// again from nothing (a missing counter reads as 0).
pub async fn clear_idle_groups(
    tx: &Tx,
    ks: &Keyspace,
    after: Option<&[u8]>,
    limit: usize,
) -> Result<GroupsSwept, StoreError> {
    let (rows, next) = group_counters(tx, ks, after, limit).await?;
    let mut out = GroupsSwept { cleared: 0, next };
    for (key, value) in &rows {
        if is_zero_counter(value) {
            tx.add_read_conflict_key(key);
            tx.clear(key);
            out.cleared += 1;
        }
    }
    Ok(out)
}

/// Whether any of the counters [`clear_idle_groups`] would look at is at
/// 0, and where the sweep after it would go on: a read (a snapshot), so
/// that a sweep with nothing to clear needs no write transaction.
pub async fn idle_groups_ahead(
    tx: &Tx,
    ks: &Keyspace,
    after: Option<&[u8]>,
    limit: usize,
) -> Result<(bool, Option<Vec<u8>>), StoreError> {
    let (rows, next) = group_counters(tx, ks, after, limit).await?;
    Ok((rows.iter().any(|(_, v)| is_zero_counter(v)), next))
}

/// Up to `limit` groups' counters after `after` (as a snapshot), and the
/// last key when the batch is full.
async fn group_counters(
    tx: &Tx,
    ks: &Keyspace,
    after: Option<&[u8]>,
    limit: usize,
) -> Result<(Vec<crate::store::KeyValue>, Option<Vec<u8>>), StoreError> {
    let (first, end) = ks.group_running_range();
    // The first key after `after`.
    let begin = after.map_or(first, |k| [k, &[0]].concat());
    let rows = tx.get_range(&RangeRequest::new(begin, end).limit(limit).snapshot(true)).await?;
    let next = if rows.len() == limit { rows.last().map(|(k, _)| k.clone()) } else { None };
    Ok((rows, next))
}

/// Whether a counter written by atomic adds reads 0 (FoundationDB's ADD:
/// little-endian, missing bytes 0). A negative count is left alone.
fn is_zero_counter(value: &[u8]) -> bool {
    value.iter().take(8).all(|b| *b == 0)
}
