//! The queue's view of the retry loop: every transaction that changes a
//! job returns the job with the versionstamp of the commit that changed
//! it, so the queue runs [`crate::store::run_with_info`].

pub(crate) use crate::store::run_with_info as run_committed;
use crate::store::{CommitInfo, StoreError};

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
