//! A call on the embedded store answers what the store then holds when
//! its time budget (`TxOptions::timeout`, app env `tx_timeout_ms`) ends
//! while its commit waits in a group commit (`store/embedded/group.rs`).
//!
//! A writer that finishes while another is queued leaves its writes in the
//! batch's open SQLite transaction and waits for the batch; whoever
//! commits the batch commits them, whether or not the member still waits.
//! The retry loop once dropped the member's commit when the
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
    member_cut_off_in_a_held_batch_with(db, MEMBER_BUDGET, hold).await
}

/// [`member_cut_off_in_a_held_batch`] with the member's budget.
async fn member_cut_off_in_a_held_batch_with(
    db: &Arc<EmbeddedStore>,
    member_budget: Duration,
    hold: Duration,
) -> (Result<(), StoreError>, Duration, Result<(), StoreError>) {
    // The holder starts once the member holds the writer lock (else, on
    // a multi-thread runtime, it could take the lock first and the member
    // would only queue behind it).
    let (holding, member_holds) = tokio::sync::oneshot::channel::<()>();
    let holder = {
        let db = db.clone();
        tokio::spawn(async move {
            member_holds.await.expect("the member holds the writer lock");
            run(&*db, budget(Duration::from_secs(60)), |tx| async move {
                tokio::time::sleep(hold).await;
                tx.set(b"holder", b"h");
                Ok(())
            })
            .await
        })
    };
    let started = tokio::time::Instant::now();
    let holding = std::sync::Mutex::new(Some(holding));
    let member = run(&**db, budget(member_budget), |tx| {
        let db = db.clone();
        let holding = holding.lock().expect("lock").take();
        async move {
            // Holding the writer lock: let the holder queue for it, so
            // that this commit defers to it and joins its batch.
            if let Some(holding) = holding {
                holding.send(()).expect("the holder waits");
            }
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
    // The holder keeps the batch open 1.5x the member's budget: past the
    // member's deadline, within what the store declares it waits for
    // (the grace is one budget here, `group::commit_grace`).
    let hold = MEMBER_BUDGET * 3 / 2;
    assert!(MEMBER_BUDGET + db.commit_grace(MEMBER_BUDGET) > hold, "the test's hold is within the grace");
    let (member, took, holder) = member_cut_off_in_a_held_batch(&db, hold).await;
    assert_eq!(holder, Ok(()), "the holder commits the batch");
    let stored = stored(&db, KEY).await;
    assert_truthful(&member, &stored);
    // The store knew: the batch committed the member's write.
    assert_eq!(member, Ok(()), "the batch committed the member's write (stored: {stored:?}); answered after {took:?}");
    assert!(took >= hold, "the member waited for the batch ({took:?})");
    db.close();
}

/// The same on the NIF's runtime flavor and the real clock: the member's
/// budget (1 s) ends while the holder keeps the batch open (1.5 s), and
/// the grace (one budget) ends 0.5 s after the holder's planned commit, a
/// margin that a loaded machine's late timers stay far within. Should the
/// member's timer come after the holder's commit, it answers `Ok` all the
/// same (then the commit came within its budget).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_real_clock_a_member_cut_off_answers_what_the_batch_did() {
    let dir = tempfile::tempdir().expect("dir");
    let db = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open");
    let member_budget = Duration::from_secs(1);
    let hold = member_budget * 3 / 2;
    assert!(member_budget + db.commit_grace(member_budget) >= hold + Duration::from_millis(500));
    let (member, took, holder) = member_cut_off_in_a_held_batch_with(&db, member_budget, hold).await;
    assert_eq!(holder, Ok(()));
    let stored = stored(&db, KEY).await;
    assert_truthful(&member, &stored);
    assert_eq!(member, Ok(()), "the batch committed the member's write; answered after {took:?}");
    assert!(took >= hold, "the member waited for the batch ({took:?})");
    db.close();
}

/// The grace is a bound: a batch held open past it leaves the member
/// answering `CommitUnknown` (the batch may still commit it, and here
/// does), within its budget plus the grace.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_batch_held_past_the_grace_answers_unknown_within_budget_and_grace() {
    let dir = tempfile::tempdir().expect("dir");
    let db = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open");
    let bound = MEMBER_BUDGET + db.commit_grace(MEMBER_BUDGET);
    let hold = bound + Duration::from_secs(1);
    let (member, took, holder) = member_cut_off_in_a_held_batch(&db, hold).await;
    assert_eq!(member, Err(StoreError::CommitUnknown), "the outcome was not known within the grace");
    // The paused clock moves only when every task waits: the answer comes
    // at the bound, not at the holder's wake-up.
    assert!(took <= bound + Duration::from_millis(10), "answered after {took:?}, bound {bound:?}");
    assert_eq!(holder, Ok(()));
    assert_eq!(stored(&db, KEY).await, Some(b"v".to_vec()), "the batch then committed it: unknown was the truth");
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
