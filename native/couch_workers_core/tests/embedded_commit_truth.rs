//! A call on the embedded store answers what the store then holds when
//! its time budget (`TxOptions::timeout`, app env `tx_timeout_ms`) ends
//! while its commit waits in a group commit (`store/embedded/group.rs`).
//!
//! A writer that finishes while another is queued leaves its writes in the
//! batch's open SQLite transaction and waits for the batch; whoever
//! commits the batch commits them, whether or not the member still waits.
//! Until session 12 the retry loop dropped the member's commit when the
//! budget ended and answered `CommitUnknown`, for a write the batch then
//! committed: the store could have told. Now the loop waits for the
//! commit's outcome for a grace the store declares
//! (`Database::commit_grace`), and answers `CommitUnknown` only once that
//! has run out too.
//!
//! The batch is held open for real: the writer queued behind the member
//! joins the batch and then awaits inside its transaction (holding the
//! writer lock) for longer than the member's budget. Time is tokio's
//! paused clock (one runtime thread, advanced only when every task
//! waits), so the order of the member's deadline and the holder's wake-up
//! is fixed, not a matter of how loaded the machine is.

use std::sync::Arc;
use std::time::Duration;

use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
use couch_workers_core::store::{run, Database, StoreError, TxOptions};

const KEY: &[u8] = b"member";

/// The member's budget: far below how long the holder keeps the batch open.
const MEMBER_BUDGET: Duration = Duration::from_millis(100);

fn budget(timeout: Duration) -> TxOptions {
    TxOptions { timeout, ..TxOptions::write() }
}

async fn stored(db: &EmbeddedStore, key: &'static [u8]) -> Option<Vec<u8>> {
    run(db, TxOptions::read(), |tx| async move { tx.get(key, false).await }).await.expect("read")
}

/// Runs a member (budget [`MEMBER_BUDGET`], writes [`KEY`]) that defers its
/// commit to a writer queued behind it; that writer joins the batch, keeps
/// it open for `hold` (awaiting inside its transaction, with the writer
/// lock), then writes `holder` and commits the batch. Answers the member's
/// result, how long (paused clock) it took, and the holder's result.
async fn member_cut_off_in_a_held_batch(
    db: &Arc<EmbeddedStore>,
    hold: Duration,
) -> (Result<(), StoreError>, Duration, Result<(), StoreError>) {
    let holder = {
        let db = db.clone();
        tokio::spawn(async move {
            run(&*db, budget(Duration::from_secs(60)), |tx| async move {
                tokio::time::sleep(hold).await;
                tx.set(b"holder", b"h");
                Ok(())
            })
            .await
        })
    };
    let started = tokio::time::Instant::now();
    let member = run(&**db, budget(MEMBER_BUDGET), |tx| {
        let db = db.clone();
        async move {
            // Holding the writer lock: the holder queues for it (it was
            // spawned first and runs while this task yields).
            while db.writers_queued() == 0 {
                tokio::task::yield_now().await;
            }
            tx.set(KEY, b"v");
            Ok(())
        }
    })
    .await;
    let took = started.elapsed();
    let holder = holder.await.expect("the holder's task");
    (member, took, holder)
}

/// The answer against the store's truth: `Ok` only for a write that is
/// there, an error other than `CommitUnknown` only for one that is not.
fn assert_truthful(answer: &Result<(), StoreError>, stored: &Option<Vec<u8>>) {
    match answer {
        Ok(()) => assert_eq!(stored.as_deref(), Some(&b"v"[..]), "answered Ok for a write that is not there"),
        Err(StoreError::CommitUnknown) => {}
        Err(e) => assert_eq!(*stored, None, "answered {e:?} (not committed) for a write that is there"),
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_member_cut_off_by_its_budget_answers_what_the_batch_did() {
    let dir = tempfile::tempdir().expect("dir");
    let db = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open");
    // The holder keeps the batch open 3x the member's budget: past the
    // member's deadline, within what the store declares it can wait.
    let hold = 3 * MEMBER_BUDGET;
    let (member, took, holder) = member_cut_off_in_a_held_batch(&db, hold).await;
    assert_eq!(holder, Ok(()), "the holder commits the batch");
    let stored = stored(&db, KEY).await;
    assert_truthful(&member, &stored);
    // The store knew: the batch committed the member's write.
    assert_eq!(member, Ok(()), "the batch committed the member's write (stored: {stored:?}); answered after {took:?}");
    assert!(took >= hold, "the member waited for the batch ({took:?})");
    db.close();
}

/// A writer whose budget ends while it still queues for the writer lock
/// has written nothing: `TimedOut` (not `CommitUnknown`) is its truth.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_writer_cut_off_while_queued_answers_timed_out_and_wrote_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let db = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open");
    // Holds the writer lock (a bare transaction, outside any budget).
    let held = db.create_transaction(&TxOptions::write()).await.expect("holder");
    let answer = run(&*db, budget(MEMBER_BUDGET), |tx| async move {
        tx.set(KEY, b"v");
        Ok(())
    })
    .await;
    drop(held);
    assert_eq!(answer, Err(StoreError::TimedOut));
    assert_eq!(stored(&db, KEY).await, None);
    db.close();
}
