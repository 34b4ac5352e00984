//! Reading and writing a job type's settings.

use crate::error::Error;
use crate::jobs::place::bump_jobs_vs;
use crate::jobs::type_settings::{TypeSetting, TypeSettings};
use crate::keyspace::Keyspace;
use crate::store::{StoreError, Tx};

/// The type's settings, defaults for a type never set. `snapshot` reads
/// add no conflict (a caller that only shows them).
pub async fn type_settings(tx: &Tx, ks: &Keyspace, job_type: &[u8], snapshot: bool) -> Result<TypeSettings, StoreError> {
    match tx.get(&ks.type_settings(job_type), snapshot).await? {
        Some(value) => TypeSettings::decode(&value),
        None => Ok(TypeSettings::default()),
    }
}

/// Applies `changes` to the stored settings (read in this transaction, so
/// two concurrent changes of different settings both land). A change of
/// a running limit bumps the type's `jobs_vs`, so that every node's
/// dispatcher looks again at once (a raised limit serves waiting
/// acceptors); a change of the activity timeout bumps `activity_vs`, so
/// that every node's activity observer reads it again. `Invalid` for a
/// value out of range, and nothing written.
pub async fn set_type_settings(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    changes: &[TypeSetting],
) -> Result<Result<TypeSettings, Error>, StoreError> {
    let old = type_settings(tx, ks, job_type, false).await?;
    let new = match old.with(changes) {
        Ok(new) => new,
        Err(e) => return Ok(Err(e)),
    };
    if new != old {
        tx.set(&ks.type_settings(job_type), &new.encode());
        if new.limits_differ(&old) {
            bump_jobs_vs(tx, ks, job_type);
        }
        // Every node's activity observer reads the default timeouts
        // again (one with nothing to observe sleeps on this key).
        if new.activity_timeout != old.activity_timeout {
            tx.set_versionstamped_value(&ks.activity_vs(), &Keyspace::vs_placeholder_value());
        }
    }
    Ok(Ok(new))
}
