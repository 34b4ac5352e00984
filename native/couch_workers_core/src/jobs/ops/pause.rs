//! Pausing and resuming a job type.

use super::helpers::bump_pending;
use crate::keyspace::Keyspace;
use crate::store::{StoreError, Tx};

/// Pauses (`true`) or resumes the type, cluster-wide: the flag every
/// accept round reads, and a bump of `jobs_vs` so that every node's
/// dispatcher runs a round now (a resume wakes waiting acceptors at once).
pub async fn set_paused(tx: &Tx, ks: &Keyspace, job_type: &[u8], paused: bool) -> Result<(), StoreError> {
    let key = ks.paused(job_type);
    let now_paused = tx.get(&key, false).await?.is_some();
    if now_paused != paused {
        if paused {
            tx.set(&key, b"");
        } else {
            tx.clear(&key);
        }
        bump_pending(tx, ks, job_type);
    }
    Ok(())
}
