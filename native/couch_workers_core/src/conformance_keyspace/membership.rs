//! The membership watcher path and the membership change log.

use std::time::Duration;

use super::helpers::{heartbeat, ks_of, membership, node, range, register, remove, spec, stamp_of, T, TSTAMP};
use crate::conformance::StoreFactory;
use crate::store::{run, Db, TxOptions, Versionstamp};
use crate::workers::{self, Heartbeat, Membership};

/// The watcher's path: a watch on the type's `vs` armed in the transaction
/// that reads the membership fires on a register, and on a removal, made
/// through the other handle, but not on heartbeats, nor on changes of a
/// type whose name extends this one.
pub async fn membership_watch_fires_on_change_not_on_heartbeat(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    let ks = ks_of(&a.db);
    let w1 = spec(T, b"w1", br#"{"n":1}"#, 15);
    let w2 = spec(T, b"w2", br#"{"n":2}"#, 15);
    register(&a.db, &w1).await;

    let (ks, db) = (&ks, &a.db);
    let read_and_watch = || {
        run(&**db, TxOptions::read(), move |tx| async move {
            let m = workers::read_membership(&tx, ks, T).await?;
            Ok((m, tx.watch(&ks.membership_vs(T))))
        })
    };
    let (m0, mut watch) = read_and_watch().await.expect("read and watch");
    assert_eq!(m0.workers, vec![(b"w1".to_vec(), w1.options_json.clone())]);
    // Let the watch settle (FDB registers it with a storage server).
    tokio::time::sleep(Duration::from_millis(20)).await;

    for db in [&b.db, &a.db, &b.db] {
        assert_eq!(heartbeat(db, &w1, TSTAMP).await.0, Heartbeat::Renewed);
    }
    register(&b.db, &spec(b"replicator\x00x", b"w1", b"{}", 15)).await;
    register(&b.db, &spec(b"replicatorx", b"w1", b"{}", 15)).await;
    let early = tokio::time::timeout(Duration::from_millis(300), &mut watch).await;
    assert!(early.is_err(), "heartbeats and other types must not wake the watcher: {early:?}");

    let vs2 = register(&b.db, &w2).await;
    let fired = tokio::time::timeout(Duration::from_secs(2), &mut watch).await;
    assert_eq!(fired, Ok(Ok(())), "a register through the other handle wakes the watcher");
    let (m1, mut watch) = read_and_watch().await.expect("read and watch again");
    assert_eq!(m1.vs, vs2);
    assert!(m1.vs > m0.vs);
    assert_eq!(m1.workers, vec![(b"w1".to_vec(), w1.options_json.clone()), (b"w2".to_vec(), w2.options_json.clone())]);
    tokio::time::sleep(Duration::from_millis(20)).await;

    assert_eq!(heartbeat(&b.db, &w2, TSTAMP).await.0, Heartbeat::Renewed);
    assert!(
        tokio::time::timeout(Duration::from_millis(200), &mut watch).await.is_err(),
        "a heartbeat must not wake it"
    );
    assert!(remove(&b.db, T, b"w1").await.0);
    let fired = tokio::time::timeout(Duration::from_secs(2), &mut watch).await;
    assert_eq!(fired, Ok(Ok(())), "a removal through the other handle wakes the watcher");
    let (m2, _watch) = read_and_watch().await.expect("read after removal");
    assert!(m2.vs > m1.vs);
    assert_eq!(m2.workers, vec![(b"w2".to_vec(), w2.options_json.clone())]);
}

async fn changes_since(db: &Db, worker_type: &[u8], since: &Versionstamp) -> workers::MembershipChanges {
    let ks = &ks_of(db);
    run(
        &**db,
        TxOptions::read(),
        |tx| async move { workers::read_membership_changes(&tx, ks, worker_type, since).await },
    )
    .await
    .expect("read membership changes")
}

/// The change log says exactly what changed after a versionstamp: joins
/// with their current options, leaves, a re-join with new options, and
/// nothing for a heartbeat; several changes of one worker fold into its
/// current state.
pub async fn membership_changes_since_a_versionstamp(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    register(&a.db, &spec(T, b"w1", b"{\"n\":1}", 15)).await;
    let vs1 = register(&a.db, &spec(T, b"w2", b"{\"n\":2}", 15)).await;
    let none = changes_since(&b.db, T, &vs1).await;
    assert!(none.complete && none.changes.is_empty() && none.vs == vs1, "{none:?}");
    heartbeat(&b.db, &spec(T, b"w1", b"{\"n\":1}", 15), TSTAMP).await;
    assert!(changes_since(&a.db, T, &vs1).await.changes.is_empty(), "a heartbeat is no change");
    register(&b.db, &spec(T, b"w3", b"{\"n\":3}", 15)).await;
    remove(&a.db, T, b"w1").await;
    register(&b.db, &spec(T, b"w2", b"{\"n\":22}", 15)).await;
    register(&a.db, &spec(T, b"w4", b"{}", 15)).await;
    let vs2 = remove(&b.db, T, b"w4").await.1;
    let got = changes_since(&a.db, T, &vs1).await;
    assert!(got.complete, "{got:?}");
    assert_eq!(got.vs, stamp_of(&vs2));
    let expect: Vec<(Vec<u8>, Option<Vec<u8>>)> = vec![
        (b"w1".to_vec(), None),
        (b"w2".to_vec(), Some(b"{\"n\":22}".to_vec())),
        (b"w3".to_vec(), Some(b"{\"n\":3}".to_vec())),
        (b"w4".to_vec(), None),
    ];
    let mut changes = got.changes.clone();
    changes.sort();
    assert_eq!(changes, expect);
    // Other types' changes are not in this type's log.
    register(&a.db, &spec(b"other", b"x", b"{}", 15)).await;
    assert_eq!(changes_since(&a.db, T, &stamp_of(&vs2)).await.changes, vec![]);
}

/// When the log no longer reaches back to the versionstamp (entries
/// trimmed), the answer says so, and the caller reads everything.
pub async fn membership_changes_incomplete_when_log_trimmed(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let vs1 = register(&a.db, &spec(T, b"w1", b"{}", 15)).await;
    register(&a.db, &spec(T, b"w2", b"{}", 15)).await;
    register(&a.db, &spec(T, b"w3", b"{}", 15)).await;
    // Trim every entry but the last, as 60 s of age would: clear them and
    // raise the floor to the last entry's version.
    let ks = ks_of(&a.db);
    let log = range(&a.db, ks.membership_log_range(T)).await;
    assert_eq!(log.len(), 3, "one log entry per change");
    let (begin, _) = ks.membership_log_range(T);
    let last = log[2].0.clone();
    let Some(crate::keyspace::WorkerKey::Log { vs: last_vs, .. }) = ks.parse_worker_key(&last) else {
        panic!("a log key")
    };
    let floor = ks.membership_log_floor(T);
    let floor_version = crate::keyspace::version_of(&last_vs).to_be_bytes();
    run(&*a.db, TxOptions::write(), |tx| {
        let (begin, last, floor) = (begin.clone(), last.clone(), floor.clone());
        async move {
            tx.clear_range(&begin, &last);
            tx.set(&floor, &floor_version);
            Ok(())
        }
    })
    .await
    .expect("trim");
    // Reading from the last entry on is still complete.
    let from_last = changes_since(&a.db, T, &last_vs).await;
    assert!(from_last.complete && from_last.changes.is_empty(), "{from_last:?}");
    let got = changes_since(&a.db, T, &vs1).await;
    assert!(!got.complete, "a gap in the log must be reported: {got:?}");
}

/// A watcher fed by the change log delivers, after each change, exactly
/// what a full read returns, with 200 members and changes made through a
/// second handle.
pub async fn membership_watcher_incremental_matches_full_reads(s: &dyn StoreFactory) {
    let a = s.fresh().await;
    let b = s.second(&a).await;
    for i in 0..200u32 {
        register(&b.db, &spec(T, format!("m{i:03}").as_bytes(), format!("{{\"i\":{i}}}").as_bytes(), 15)).await;
    }
    let n = node(&a.db);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Membership>();
    let _watch = n
        .watch_membership(
            T.to_vec(),
            Box::new(move |m| {
                let _ = tx.send(m);
            }),
        )
        .expect("watch");
    let first = next_delivery(&mut rx).await;
    assert_eq!(first.workers.len(), 200);
    let steps: Vec<(&[u8], bool)> =
        vec![(b"new1", true), (b"m007", false), (b"m100", true), (b"new2", true), (b"new1", false)];
    for (id, join) in steps {
        if join {
            register(&b.db, &spec(T, id, b"{\"again\":true}", 15)).await;
        } else {
            remove(&b.db, T, id).await;
        }
        // Deliveries may fold changes; wait until the watcher has caught up
        // with this one, then compare with a full read.
        let full = membership(&b.db, T).await;
        let mut got = next_delivery(&mut rx).await;
        while got.vs < full.vs {
            got = next_delivery(&mut rx).await;
        }
        assert_eq!(got.vs, full.vs);
        assert_eq!(
            got.workers,
            full.workers,
            "after {} {}",
            if join { "join" } else { "leave" },
            String::from_utf8_lossy(id)
        );
    }
    n.stop().await;
}

async fn next_delivery(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Membership>) -> Membership {
    tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("a delivery in 5 s").expect("watcher open")
}
