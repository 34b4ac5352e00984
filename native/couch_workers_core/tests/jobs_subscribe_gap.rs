//! Job subscriptions, a known gap (ignored until it is closed): a job
//! removed and added again with the same id between two reads of its
//! watcher. Apart from `tests/jobs_subscribe.rs`, whose tests all run on a
//! live FoundationDB too (`scripts/live-cargo-test.sh` runs every ignored
//! test of the binaries it is given, and fails on any that fails).

mod jobs_common;

use couch_workers_core::jobs::JobEvent;
use jobs_common::*;

const T: &[u8] = b"indexer";

/// A job removed and added again with the same id before the watcher
/// reads it (here in one transaction, so no read can see it absent) is
/// another job: its subscribers should get `Removed`, not a change.
/// Known gap: the record carries nothing that tells a new job of the same
/// id from a later version of the old one (its VS changes at every write,
/// a resubmit also resets attempts and error). The fix is a creation
/// versionstamp in the record (set by add, kept by every other write),
/// compared by the watcher; kept ignored until the record has it.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "known gap: a removal and a re-add between two reads of a job watcher look like one change"]
async fn remove_and_add_again_between_two_reads_tells_removed() {
    use couch_workers_core::jobs::{ops, NewJob};
    use couch_workers_core::store::{run, TxOptions};
    let c = Cluster::new();
    let node = c.node();
    let jobs = node.jobs();
    add(jobs, T, b"j", 0).await;
    let (on, mut rx) = events();
    let (_, _sub) = jobs.subscribe(T, b"j", on).await.unwrap();
    let ks = ks(&node).clone();
    let k = &ks;
    let again = NewJob { id: b"j".to_vec(), info: b"{\"new\":1}".to_vec(), priority: 0 };
    let a = &again;
    run(node.db().as_ref(), TxOptions::write(), |tx| async move {
        ops::remove(&tx, k, T, b"j").await?.expect("removed");
        ops::add(&tx, k, T, a).await?.expect("added");
        Ok(())
    })
    .await
    .expect("remove and add");
    assert_eq!(next_event(&mut rx).await, JobEvent::Removed, "the job subscribed to is gone");
    node.stop().await;
}
