//! A worker reaped (its node could not write for longer than its timeout)
//! and then unregistered by its owner stays removed, also when a renewal
//! of it read its health record "absent" before the unregister and
//! commits after it.
//!
//! The node's steps, one transaction each, in the order that races
//! (`Node::unregister_worker` cancels the registration before its
//! transaction; the heartbeat asks `ended` after its reads, before it
//! writes, see `roster::heartbeat_many`):
//!
//! 1. the renewal reads the record: absent (reaped); the registration is
//!    not ended yet, so it writes the reinstatement;
//! 2. the owner unregisters: the cancel, then a transaction that reads
//!    the record (absent: the renewal has not committed) and removes
//!    nothing;
//! 3. the renewal commits.
//!
//! On a store with FoundationDB's optimistic transactions (the `sim`
//! store, FoundationDB) an unregister that wrote nothing was never
//! checked for conflicts, and the renewal's read was not in conflict with
//! any write: the reinstatement committed after the unregister answered
//! `ok`, leaving a member that nobody heartbeats (reaped again only after
//! its timeout) and whose running jobs would fail then, not be released.
//! The embedded store serializes write transactions, so it cannot
//! interleave them this way. The same holds for the removal of a
//! registration whose owner died (`Node::worker_died`).

mod jobs_common;

use couch_workers_core::roster::{self, Beat};
use couch_workers_core::store::{run, StoreError, TxOptions};
use couch_workers_core::workers::{self, Heartbeat};
use jobs_common::*;

const T: &[u8] = b"replicator";
const ID: &[u8] = b"w";

async fn a_renewal_that_read_absent_does_not_reinstate_after_the_unregister(store: StoreKind) {
    renewal_after_removal(store, false).await;
}

async fn a_renewal_that_read_absent_does_not_reinstate_after_an_owner_death(store: StoreKind) {
    renewal_after_removal(store, true).await;
}

async fn renewal_after_removal(store: StoreKind, died: bool) {
    let c = Cluster::on(store);
    let node = c.node();
    let db = node.db().clone();
    let ks = ks(&node).clone();
    let spec = spec(T, ID);
    let inc = workers::new_incarnation();
    let (ks, spec, inc) = (&ks, &spec, &inc);

    // Registered, then reaped: the reaper removes the record it observed.
    run(db.as_ref(), TxOptions::write(), |tx| async move { roster::register(&tx, ks, spec, inc, 1).await })
        .await
        .expect("register");
    let observed = raw_get(&node, &ks.health(T, ID)).await.expect("a health record");
    let observed = &observed;
    let reaped = run(db.as_ref(), TxOptions::write(), |tx| async move { roster::reap(&tx, ks, T, ID, observed).await })
        .await
        .expect("reap");
    assert!(reaped, "reaped");

    // 1. The renewal reads "absent" and writes the reinstatement.
    let renewal = db.create_transaction(&TxOptions::write()).await.expect("a transaction");
    let beats = [Beat { spec, incarnation: inc }];
    let outcome = roster::heartbeat_many(&renewal, ks, &beats, 2, |_| false).await.expect("renew");
    assert_eq!(outcome, vec![Some(Heartbeat::Reinstated)]);

    // 2. The owner's unregister (or its death's removal), from start to
    // end: nothing to remove.
    let removed = run(db.as_ref(), TxOptions::write(), |tx| async move {
        if died {
            Ok(roster::remove_dead(&tx, ks, T, ID, inc).await?.is_some())
        } else {
            roster::remove(&tx, ks, T, ID, inc).await
        }
    })
    .await
    .expect("unregister");
    assert!(!removed, "the record was absent");

    // 3. The renewal commits after the unregister: it must not land. (Its
    // retry would read the record again and find the registration ended.)
    let committed = renewal.commit().await;
    assert_eq!(
        raw_get(&node, &ks.member(T, ID)).await,
        None,
        "the worker is a member again after its unregister answered ok (the renewal's commit: {committed:?})"
    );
    assert!(matches!(committed, Err(StoreError::Conflict)), "the renewal conflicts: {committed:?}");
    node.stop().await;
}

couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread"),
    stores: [sim: Sim],
    tests: [
        a_renewal_that_read_absent_does_not_reinstate_after_the_unregister,
        a_renewal_that_read_absent_does_not_reinstate_after_an_owner_death,
    ],
);
