//! Removing ended jobs past their `keep`.

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
