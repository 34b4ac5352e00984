//! Unique keys: while a job with a unique key is scheduled, pending or
//! running, the key `("unique", JobType, Key)` holds its id, and no other
//! job of the type may take the key. Claimed in the transaction that adds
//! or queues the job (read, not as a snapshot: two transactions claiming
//! one key conflict, and the second sees the first's claim on its retry);
//! given up in the transaction that ends or removes it
//! (`place::give_up_unique`).

use super::helpers::read_record;
use crate::error::{check_key, Error};
use crate::jobs::job::JobOpts;
use crate::keyspace::Keyspace;
use crate::store::{StoreError, Tx};

/// The holder of `key` other than `id`, if there is one: the stored id,
/// if that job exists, has not ended and still has this key. (A key
/// whose holder is gone, as a node of an older version could leave it,
/// is free: one more read, and only when the key is there.)
pub(super) async fn holder(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    key: &[u8],
    id: &[u8],
) -> Result<Option<Vec<u8>>, StoreError> {
    let Some(stored) = tx.get(&ks.unique(job_type, key), false).await? else {
        return Ok(None);
    };
    if stored == id {
        return Ok(None);
    }
    let holds = match read_record(tx, ks, job_type, &stored, false).await? {
        Some(rec) => !rec.state.is_terminal() && rec.unique.as_deref() == Some(key),
        None => false,
    };
    Ok(holds.then_some(stored))
}

/// Checks that the keys a job's options give it fit, before anything is
/// read: its unique key's, and its group's running counter (which a job
/// over the limit could never be accepted under).
pub(super) fn check_option_keys(ks: &Keyspace, job_type: &[u8], opts: &JobOpts) -> Result<(), Error> {
    if let Some(key) = &opts.unique {
        check_key(&ks.unique(job_type, key))?;
    }
    if let Some(group) = &opts.group {
        check_key(&ks.group_running(job_type, group))?;
    }
    Ok(())
}

/// Takes `key` for job `id`: `Duplicate(holder)` (nothing written) if
/// another unended job holds it.
pub(super) async fn claim(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    key: &[u8],
    id: &[u8],
) -> Result<Result<(), Error>, StoreError> {
    if let Some(other) = holder(tx, ks, job_type, key, id).await? {
        return Ok(Err(Error::Duplicate(other)));
    }
    tx.set(&ks.unique(job_type, key), id);
    Ok(Ok(()))
}

/// Moves job `id` from holding `held` (the key it holds now, if any) to
/// holding `wanted`: claims `wanted` unless it is the key held already,
/// then gives up `held`. `Duplicate` (nothing written) if another job
/// holds `wanted`. `wanted` `None` keeps what is held.
pub(super) async fn change(
    tx: &Tx,
    ks: &Keyspace,
    job_type: &[u8],
    id: &[u8],
    held: Option<&[u8]>,
    wanted: Option<&[u8]>,
) -> Result<Result<(), Error>, StoreError> {
    let Some(wanted) = wanted.filter(|w| Some(*w) != held) else {
        return Ok(Ok(()));
    };
    if let Err(e) = claim(tx, ks, job_type, wanted, id).await? {
        return Ok(Err(e));
    }
    if let Some(old) = held {
        tx.clear(&ks.unique(job_type, old));
    }
    Ok(Ok(()))
}
