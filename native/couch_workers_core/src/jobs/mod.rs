//! The job queue (being built: see the README's status table).

use crate::keyspace::Keyspace;
use crate::store::{RangeRequest, StoreError, Tx};

/// Sends every job that `worker` of `worker_type` is running back to
/// pending, in the caller's transaction. Returns how many.
pub async fn requeue_worker_jobs(tx: &Tx, ks: &Keyspace, worker_type: &[u8], worker: &[u8]) -> Result<usize, StoreError> {
    let (begin, end) = ks.active_range(worker_type, worker);
    let active = tx.get_range(&RangeRequest::new(begin, end).limit(1)).await?;
    if active.is_empty() {
        Ok(0)
    } else {
        Err(StoreError::Invalid("job queue not built yet".into()))
    }
}
