//! The roster: every write of a worker registration that can end one
//! (register, heartbeat, remove, reap), with what that end does to the
//! jobs the registration runs, in the same transaction: an unregister
//! releases them (back to pending), a death (a reap, a dead owner, a new
//! registration of the same id) fails them with `worker_lost`. `workers`
//! writes the worker keys and `jobs` the job keys, neither knowing the
//! other; this module is where the two meet, above both.
//!
//! Each runs inside a transaction of the caller's, so that the retry loop,
//! the conformance suite and the services share one definition.

use crate::jobs::{self, Departure};
use crate::keyspace::{Incarnation, Keyspace};
use crate::store::{StoreError, Tx};
use crate::workers::{self, Heartbeat, WorkerSpec};

/// Registers `spec` as `incarnation`: any other incarnation of the same
/// `(type, id)` is replaced, and the jobs it was running go back to
/// pending, since the new incarnation knows nothing of them.
pub async fn register(
    tx: &Tx,
    ks: &Keyspace,
    spec: &WorkerSpec,
    incarnation: &Incarnation,
    tstamp: i64,
) -> Result<(), StoreError> {
    register_replacing(tx, ks, spec, incarnation, tstamp).await.map(|_| ())
}

/// As [`register`]; returns how many running jobs of a replaced
/// registration it failed over in this transaction (the node counts them
/// as requeued).
pub async fn register_replacing(
    tx: &Tx,
    ks: &Keyspace,
    spec: &WorkerSpec,
    incarnation: &Incarnation,
    tstamp: i64,
) -> Result<usize, StoreError> {
    if !workers::write_registration(tx, ks, spec, incarnation, tstamp).await? {
        return Ok(0);
    }
    // The id's previous registration is gone without unregistering (its
    // node restarted, or another node took the id): a death.
    jobs::requeue_worker_jobs(tx, ks, &spec.worker_type, &spec.id, Departure::Lost).await
}

/// Renews the health record of `incarnation`; reinstates it if the worker
/// was removed. Another incarnation's record is left as it is (`Gone`):
/// renewing it would keep a registration alive that nobody heartbeats.
/// The service renews many at once ([`heartbeat_many`]); this one is for
/// the tests.
#[cfg(any(test, feature = "internals"))]
pub async fn heartbeat(
    tx: &Tx,
    ks: &Keyspace,
    spec: &WorkerSpec,
    incarnation: &Incarnation,
    tstamp: i64,
) -> Result<Heartbeat, StoreError> {
    let stored = workers::stored_health(tx, ks, &spec.worker_type, &spec.id).await?;
    let outcome = renew(tx, ks, spec, incarnation, tstamp, stored).await?;
    if outcome == Heartbeat::Renewed {
        workers::mark_health_written(tx, ks);
    }
    Ok(outcome)
}

/// The heartbeat's decision on the health record `stored` (read for a
/// write in this transaction), and its write.
async fn renew(
    tx: &Tx,
    ks: &Keyspace,
    spec: &WorkerSpec,
    incarnation: &Incarnation,
    tstamp: i64,
    stored: Option<Vec<u8>>,
) -> Result<Heartbeat, StoreError> {
    let outcome = workers::heartbeat_outcome(stored.as_deref(), incarnation);
    match outcome {
        Heartbeat::Renewed => workers::write_health(tx, ks, spec, incarnation, tstamp),
        Heartbeat::Gone => {}
        Heartbeat::Reinstated => register(tx, ks, spec, incarnation, tstamp).await?,
    }
    Ok(outcome)
}

/// One registration to renew in [`heartbeat_many`].
pub struct Beat<'a> {
    pub spec: &'a WorkerSpec,
    pub incarnation: &'a Incarnation,
}

/// [`heartbeat`] for many registrations in one transaction: their health
/// records are read together (one round trip on FoundationDB), then each
/// is judged as [`heartbeat`] judges one. `ended(i)` is asked after the
/// reads, before anything of `beats[i]` is written: a registration whose
/// owner ended it meanwhile (its removal may have committed before these
/// reads, and must not be undone by a reinstatement) is skipped (`None`).
pub async fn heartbeat_many(
    tx: &Tx,
    ks: &Keyspace,
    beats: &[Beat<'_>],
    tstamp: i64,
    ended: impl Fn(usize) -> bool,
) -> Result<Vec<Option<Heartbeat>>, StoreError> {
    let keys: Vec<Vec<u8>> = beats.iter().map(|b| ks.health(&b.spec.worker_type, &b.spec.id)).collect();
    let stored = futures::future::try_join_all(keys.iter().map(|k| tx.get(k, false))).await?;
    let mut outcomes = Vec::with_capacity(beats.len());
    for (i, (beat, value)) in beats.iter().zip(stored).enumerate() {
        if ended(i) {
            outcomes.push(None);
            continue;
        }
        outcomes.push(Some(renew(tx, ks, beat.spec, beat.incarnation, tstamp, value).await?));
    }
    // A reinstatement marked it already; once is enough either way.
    if outcomes.contains(&Some(Heartbeat::Renewed)) {
        workers::mark_health_written(tx, ks);
    }
    Ok(outcomes)
}

/// Removes the worker if `incarnation` still holds it, and sends its
/// running jobs back to pending, in this one transaction. Returns whether
/// it removed it (false: not registered, or registered by another
/// incarnation, which keeps its registration and its jobs).
pub async fn remove(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    id: &[u8],
    incarnation: &Incarnation,
) -> Result<bool, StoreError> {
    match workers::stored_health(tx, ks, worker_type, id).await? {
        Some(value) if workers::held_by(&value, incarnation) => {
            Ok(remove_current(tx, ks, worker_type, id, Departure::Released).await?.is_some())
        }
        None => {
            workers::write_absent(tx, ks, worker_type, id);
            Ok(false)
        }
        Some(_) => Ok(false),
    }
}

/// As [`remove`], for a registration whose owner died (its pid exited):
/// a death, so its running jobs fail with `worker_lost` (as a reaped
/// worker's do), where an unregister releases them. `Some(n)`: removed, `n` running
/// jobs failed over in this transaction (the node counts them as
/// requeued); `None`: not removed (as `false` of [`remove`]).
pub async fn remove_dead(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    id: &[u8],
    incarnation: &Incarnation,
) -> Result<Option<usize>, StoreError> {
    match workers::stored_health(tx, ks, worker_type, id).await? {
        Some(value) if workers::held_by(&value, incarnation) => {
            remove_current(tx, ks, worker_type, id, Departure::Lost).await
        }
        None => {
            workers::write_absent(tx, ks, worker_type, id);
            Ok(None)
        }
        Some(_) => Ok(None),
    }
}

/// Removes whichever incarnation is registered: only for a caller that has
/// judged the current health record in this transaction (the reaper).
/// `Some(n)`: removed, and `n` of its running jobs left it in this
/// transaction (the sweeper moves any beyond one transaction's share).
async fn remove_current(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    id: &[u8],
    departure: Departure,
) -> Result<Option<usize>, StoreError> {
    if !workers::clear_registration(tx, ks, worker_type, id).await? {
        return Ok(None);
    }
    Ok(Some(jobs::requeue_worker_jobs(tx, ks, worker_type, id, departure).await?))
}

/// Reaps the worker if its health record is still, byte for byte,
/// `observed`: the record a reaper has seen unchanged for the worker's
/// timeout (`liveness.rs` decides that; this only re-checks). A heartbeat
/// (a new versionstamp) or another registration (another incarnation)
/// makes it a different record, which is left alone; so is an absent one.
/// Reading the record for a write is what makes concurrent reapers safe: a
/// heartbeat or another reap that commits first makes this transaction
/// conflict and re-check. Returns whether it removed the worker. (The
/// reaper calls [`reap_with_jobs`]; this one is for the tests.)
#[cfg(any(test, feature = "internals"))]
pub async fn reap(tx: &Tx, ks: &Keyspace, worker_type: &[u8], id: &[u8], observed: &[u8]) -> Result<bool, StoreError> {
    Ok(reap_with_jobs(tx, ks, worker_type, id, observed).await?.is_some())
}

/// As [`reap`]; `Some(n)` when it removed the worker, `n` being the
/// running jobs that left it in this transaction (failed with
/// `worker_lost`: back to pending, or `failed` without attempts left).
/// The reaper logs `n`, which is how a node counts its failovers.
pub async fn reap_with_jobs(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    id: &[u8],
    observed: &[u8],
) -> Result<Option<usize>, StoreError> {
    match workers::stored_health(tx, ks, worker_type, id).await? {
        // Reaped: a death, its jobs fail with `worker_lost`.
        Some(value) if value == observed => remove_current(tx, ks, worker_type, id, Departure::Lost).await,
        _ => Ok(None),
    }
}
