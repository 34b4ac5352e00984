//! A writer that left its commit to a group commit (`group.rs`) and whose
//! commit future was dropped while it waited for the batch (the retry
//! loop's timeout does this, and answers `CommitUnknown`) still has its
//! writes committed by the batch: the store's truth. The handle's own
//! watches of what it wrote must then fire at once, as for any local
//! commit, not at the next safety look. Once only the member
//! itself told the watch hub, after the batch's outcome reached it, so a
//! dropped member's writes were seen by the handle's watcher only at its
//! next look for another reason (the safety look: an hour here).

use std::sync::Arc;

use couch_workers_core::store::embedded::EmbeddedStore;
use couch_workers_core::store::{Database, TxOptions};
use futures::FutureExt;

mod late_fire_common;
use late_fire_common::{armed_watch, hour_safety_look, FIRE_LIMIT};

/// One runtime thread: the queued writer runs only when this task waits,
/// so it cannot commit the batch (and answer the member) within the one
/// poll of the member's commit.
#[tokio::test(flavor = "current_thread")]
async fn a_dropped_group_members_committed_write_fires_the_handles_watch() {
    let dir = tempfile::tempdir().expect("dir");
    let opts = hour_safety_look(dir.path());
    let db: Arc<EmbeddedStore> = EmbeddedStore::open(opts).expect("open");
    // Armed once the watcher thread has read `k` since (`armed_watch`).
    let w = armed_watch(&*db, b"k").await;

    // The member: holds the writer lock while a second writer queues.
    let member = db.create_transaction(&TxOptions::write()).await.expect("member tx");
    let next = {
        let db = db.clone();
        tokio::spawn(async move {
            let tx = db.create_transaction(&TxOptions::write()).await.expect("next tx");
            tx.set(b"other", b"x");
            tx.commit().await.expect("the next writer commits the batch");
        })
    };
    while db.writers_queued() == 0 {
        tokio::task::yield_now().await;
    }
    member.set(b"k", b"v");
    // One poll: the member defers its commit to the queued writer and
    // waits for the batch; then its commit future is dropped.
    let polled = member.commit().now_or_never();
    assert!(polled.is_none(), "the member waits for the batch it joined: {polled:?}");
    next.await.expect("the next writer");

    let tx = db.create_transaction(&TxOptions::read()).await.expect("tx");
    assert_eq!(tx.get(b"k", false).await.expect("read"), Some(b"v".to_vec()), "the batch committed the member's write");
    drop(tx);
    tokio::time::timeout(FIRE_LIMIT, w)
        .await
        .expect("the committed write fires the handle's watch without waiting for the safety look")
        .expect("fired");
    db.close();
}
