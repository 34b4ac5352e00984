//! The queue's view of the retry loop: every transaction that changes a
//! job returns the job with the versionstamp of the commit that changed
//! it, so the queue runs [`crate::store::run_attempts`].

use std::future::Future;

use crate::keyspace::Keyspace;
use crate::store::receipt::{self, run_retry_safe};
use crate::store::{CommitInfo, Database, StoreError, Tx, TxOptions};

/// Runs a job write whose answer is `Ok(())` or an expected error, so
/// that it answers for its own commit (`store::receipt`): the write sets
/// its receipt in its transaction, and an attempt after one that may have
/// committed answers `Ok(())` if that receipt is there. An expected error
/// wrote nothing, so it sets no receipt and is decided afresh.
pub(crate) async fn run_once<E, F, Fut>(
    db: &dyn Database,
    opts: TxOptions,
    ks: &Keyspace,
    body: F,
) -> Result<Result<(), E>, StoreError>
where
    F: Fn(Tx) -> Fut,
    Fut: Future<Output = Result<Result<(), E>, StoreError>>,
{
    let body = &body;
    let (outcome, _) = run_retry_safe(db, opts, ks, |tx, landed| async move {
        if landed.is_some() {
            return Ok((Ok(()), None));
        }
        let outcome = body(tx).await?;
        let done = outcome.is_ok().then(|| receipt::DONE.to_vec());
        Ok((outcome, done))
    })
    .await?;
    Ok(outcome)
}

/// The commit's versionstamp, which every transaction that wrote a job
/// record has (the record's VS is a versionstamped value).
pub(crate) fn commit_vs(info: &CommitInfo) -> Result<crate::store::Versionstamp, StoreError> {
    info.versionstamp
        .ok_or_else(|| StoreError::Invalid("the store reported no versionstamp for a versionstamped commit".into()))
}

/// Fills in a handle's versionstamp from the commit that took its job. A
/// handle found again by a retried accept round (`ops::Acceptors::recheck`)
/// already has the versionstamp of the earlier commit, and this commit
/// may have written nothing versionstamped.
pub(crate) fn complete_handle_vs(handle: &mut super::job::JobHandle, info: &CommitInfo) -> Result<(), StoreError> {
    if super::record::is_incomplete(&handle.job.vs) {
        super::record::complete_vs(&mut handle.job.vs, &commit_vs(info)?);
    }
    Ok(())
}
