//! Worker key-space operations, each run inside a transaction of the
//! caller's (so that the retry loop, the conformance suite and the services
//! share one definition). See `keyspace.rs` for the layout.
//!
//! Every change of a type's member set (register, unregister, reap) bumps
//! `("couch_workers", "workers", T, "vs")` with the commit's versionstamp:
//! membership watchers watch that one key, so heartbeats (which only touch
//! health records) wake nobody.
//!
//! Each registration is an incarnation ([`Incarnation`], stored in the
//! health record). Heartbeats and removals name the incarnation they act
//! for and leave any other alone: a handle whose removal failed and is
//! retried late, or a second node that registered the same id, must not
//! remove, requeue or keep alive the registration that holds the id now.

use crate::error::{check_key, check_value, Error};
use crate::jobs;
use crate::keyspace::{Health, Incarnation, Keyspace};
use crate::liveness;
use crate::store::{RangeRequest, StoreError, Tx, Versionstamp};

/// A worker as registered: what is stored, and what its heartbeat needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSpec {
    pub worker_type: Vec<u8>,
    pub id: Vec<u8>,
    /// The options map as a JSON object (what other nodes see).
    pub options_json: Vec<u8>,
    /// Health timeout, seconds (> 0).
    pub timeout_s: u64,
}

impl WorkerSpec {
    /// Checks the limits that hold on every store, before any write.
    pub fn validate(&self, ks: &Keyspace) -> Result<(), Error> {
        if self.timeout_s == 0 || self.timeout_s > MAX_TIMEOUT_S {
            return Err(Error::Invalid("invalid_timeout"));
        }
        check_key(&ks.member(&self.worker_type, &self.id))?;
        check_key(&ks.health(&self.worker_type, &self.id))?;
        check_value(&self.options_json)
    }
}

/// The longest health timeout accepted: one week. Longer ones are almost
/// certainly a unit mistake (milliseconds given as seconds).
pub const MAX_TIMEOUT_S: u64 = 7 * 24 * 3600;

/// The live workers of a type: `(id, options JSON)` in id order, with the
/// versionstamp of the last change (all zeros when the type never changed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub worker_type: Vec<u8>,
    pub vs: Versionstamp,
    pub workers: Vec<(Vec<u8>, Vec<u8>)>,
}

/// What a heartbeat found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heartbeat {
    /// The worker was registered; its health record is renewed.
    Renewed,
    /// The worker had been removed (reaped while this node could not write
    /// in time); it is registered again, under the same incarnation.
    Reinstated,
    /// Another incarnation holds the id now (registered later, here or on
    /// another node): this registration is gone, and nothing was written.
    Gone,
}

/// A fresh incarnation for a new registration.
pub fn new_incarnation() -> Incarnation {
    let mut incarnation = Incarnation::default();
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut incarnation);
    incarnation
}

/// How long membership log entries are kept, in store versions (60 s).
/// A watcher that has read the log within half of it never misses an
/// entry; one that has not (a long store outage) reads the whole member
/// range instead.
pub const LOG_RETENTION_VERSIONS: u64 = 60 * liveness::VERSIONS_PER_SECOND;

/// A member-set change, as the log records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Join,
    Leave,
}

impl Change {
    fn tag(self) -> &'static [u8] {
        match self {
            Change::Join => b"join",
            Change::Leave => b"leave",
        }
    }
}

/// Records a member-set change: bumps the type's `vs` (what watchers
/// watch) and appends a log entry (what watchers read), and trims log
/// entries older than [`LOG_RETENTION_VERSIONS`] so the log stays small.
async fn record_change(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    worker: &[u8],
    change: Change,
) -> Result<(), StoreError> {
    tx.set_versionstamped_value(&ks.membership_vs(worker_type), &Keyspace::vs_placeholder_value());
    let value = foundationdb_tuple::pack(&(1i64, foundationdb_tuple::Bytes::from(change.tag())));
    tx.set_versionstamped_key(&ks.membership_log_new(worker_type, worker), &value);
    let read_version = tx.read_version().await?;
    if let Some(cutoff) = read_version.checked_sub(LOG_RETENTION_VERSIONS) {
        let (begin, _) = ks.membership_log_range(worker_type);
        tx.clear_range(&begin, &ks.membership_log_at_version(worker_type, cutoff));
        // BYTE_MAX, not set: a change with an older read version may
        // commit after a newer one (they need not conflict), and the floor
        // must never move back below entries already trimmed.
        tx.atomic_byte_max(&ks.membership_log_floor(worker_type), &cutoff.to_be_bytes());
    }
    Ok(())
}

/// Decodes a log value.
fn parse_change(value: &[u8]) -> Option<Change> {
    let (format, tag) = foundationdb_tuple::unpack::<(i64, foundationdb_tuple::Bytes)>(value).ok()?;
    match (format, &*tag) {
        (1, b"join") => Some(Change::Join),
        (1, b"leave") => Some(Change::Leave),
        _ => None,
    }
}

/// Bumps `health_vs`, which reapers watch: a health record changed in
/// this transaction. A blind versionstamped set, so that heartbeats of
/// every node never conflict on it.
fn mark_health_written(tx: &Tx, ks: &Keyspace) {
    tx.set_versionstamped_value(&ks.health_vs(), &Keyspace::vs_placeholder_value());
}

fn write_health(tx: &Tx, ks: &Keyspace, spec: &WorkerSpec, incarnation: &Incarnation, tstamp: i64) {
    let timeout = i64::try_from(spec.timeout_s).unwrap_or(i64::MAX);
    let value = Keyspace::health_value(tstamp, timeout, incarnation);
    tx.set_versionstamped_value(&ks.health(&spec.worker_type, &spec.id), &value);
}

/// The raw health record of `(worker_type, id)`, read for a write: a
/// registration or removal of the id committed meanwhile conflicts.
async fn stored_health(tx: &Tx, ks: &Keyspace, worker_type: &[u8], id: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
    tx.get(&ks.health(worker_type, id), false).await
}

/// Whether a stored health value belongs to `incarnation`.
fn held_by(value: &[u8], incarnation: &Incarnation) -> bool {
    Keyspace::parse_health(value).is_some_and(|h| h.incarnation.as_ref() == Some(incarnation))
}

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
    let member_key = ks.member(&spec.worker_type, &spec.id);
    let mut moved = 0;
    if tx.get(&member_key, false).await?.is_some() {
        // The id's previous registration is gone without unregistering
        // (its node restarted, or another node took the id): a death.
        moved = jobs::requeue_worker_jobs(tx, ks, &spec.worker_type, &spec.id, jobs::Departure::Lost).await?;
    }
    tx.set(&member_key, &spec.options_json);
    write_health(tx, ks, spec, incarnation, tstamp);
    mark_health_written(tx, ks);
    record_change(tx, ks, &spec.worker_type, &spec.id, Change::Join).await?;
    Ok(moved)
}

/// Renews the health record of `incarnation`; reinstates it if the worker
/// was removed. Another incarnation's record is left as it is (`Gone`):
/// renewing it would keep a registration alive that nobody heartbeats.
pub async fn heartbeat(
    tx: &Tx,
    ks: &Keyspace,
    spec: &WorkerSpec,
    incarnation: &Incarnation,
    tstamp: i64,
) -> Result<Heartbeat, StoreError> {
    let stored = stored_health(tx, ks, &spec.worker_type, &spec.id).await?;
    let outcome = renew(tx, ks, spec, incarnation, tstamp, stored).await?;
    if outcome == Heartbeat::Renewed {
        mark_health_written(tx, ks);
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
    match stored {
        Some(value) if held_by(&value, incarnation) => {
            write_health(tx, ks, spec, incarnation, tstamp);
            Ok(Heartbeat::Renewed)
        }
        Some(_) => Ok(Heartbeat::Gone),
        None => {
            register(tx, ks, spec, incarnation, tstamp).await?;
            Ok(Heartbeat::Reinstated)
        }
    }
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
        mark_health_written(tx, ks);
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
    match stored_health(tx, ks, worker_type, id).await? {
        Some(value) if held_by(&value, incarnation) => {
            Ok(remove_current(tx, ks, worker_type, id, jobs::Departure::Released).await?.is_some())
        }
        None => {
            write_absent(tx, ks, worker_type, id);
            Ok(false)
        }
        Some(_) => Ok(false),
    }
}

/// A removal that finds no record (the worker was reaped) still writes
/// the record's key, clearing nothing: a renewal that read the record
/// absent and reinstates it must not commit after the removal answered.
/// With this write the two conflict, whichever commits second, and the
/// renewal's retry finds the registration ended (or the removal's finds
/// it reinstated, and removes it). A transaction that writes nothing is
/// never checked for conflicts on FoundationDB (tests/workers_unregister_race.rs).
fn write_absent(tx: &Tx, ks: &Keyspace, worker_type: &[u8], id: &[u8]) {
    tx.clear(&ks.health(worker_type, id));
}

/// As [`remove`], for a registration whose owner died (its pid exited):
/// a death, so its running jobs fail with `worker_lost` (DESIGN.md),
/// where an unregister releases them. `Some(n)`: removed, `n` running
/// jobs failed over in this transaction (the node counts them as
/// requeued); `None`: not removed (as `false` of [`remove`]).
pub async fn remove_dead(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    id: &[u8],
    incarnation: &Incarnation,
) -> Result<Option<usize>, StoreError> {
    match stored_health(tx, ks, worker_type, id).await? {
        Some(value) if held_by(&value, incarnation) => {
            remove_current(tx, ks, worker_type, id, jobs::Departure::Lost).await
        }
        None => {
            write_absent(tx, ks, worker_type, id);
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
    departure: jobs::Departure,
) -> Result<Option<usize>, StoreError> {
    let member_key = ks.member(worker_type, id);
    if tx.get(&member_key, false).await?.is_none() {
        return Ok(None);
    }
    let moved = jobs::requeue_worker_jobs(tx, ks, worker_type, id, departure).await?;
    tx.clear(&member_key);
    tx.clear(&ks.health(worker_type, id));
    record_change(tx, ks, worker_type, id, Change::Leave).await?;
    Ok(Some(moved))
}

/// Reaps the worker if its health record is still, byte for byte,
/// `observed`: the record a reaper has seen unchanged for the worker's
/// timeout (`liveness.rs` decides that; this only re-checks). A heartbeat
/// (a new versionstamp) or another registration (another incarnation)
/// makes it a different record, which is left alone; so is an absent one.
/// Reading the record for a write is what makes concurrent reapers safe: a
/// heartbeat or another reap that commits first makes this transaction
/// conflict and re-check. Returns whether it removed the worker.
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
    match stored_health(tx, ks, worker_type, id).await? {
        // Reaped: a death, its jobs fail with `worker_lost`.
        Some(value) if value == observed => remove_current(tx, ks, worker_type, id, jobs::Departure::Lost).await,
        _ => Ok(None),
    }
}

/// Reads the membership of `worker_type`.
pub async fn read_membership(tx: &Tx, ks: &Keyspace, worker_type: &[u8]) -> Result<Membership, StoreError> {
    let vs = read_membership_vs(tx, ks, worker_type).await?;
    let (begin, end) = ks.members_range(worker_type);
    let rows = tx.get_range(&RangeRequest::new(begin, end)).await?;
    let mut workers = Vec::with_capacity(rows.len());
    for (key, value) in rows {
        if let Some(crate::keyspace::WorkerKey::Member { worker, .. }) = ks.parse_worker_key(&key) {
            workers.push((worker, value));
        }
    }
    Ok(Membership { worker_type: worker_type.to_vec(), vs, workers })
}

/// What changed in a type's membership since a known versionstamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipChanges {
    /// The type's current membership versionstamp.
    pub vs: Versionstamp,
    /// `(worker, Some(options))` for a worker that is now a member (joined,
    /// or joined again with new options), `(worker, None)` for one that
    /// left; in commit order, at most one entry per worker.
    pub changes: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// False when the log no longer covers `since` (`since` is older than
    /// the log's floor, a log entry has no known shape, or the log does not
    /// reach the current vs): the caller must read the whole membership.
    pub complete: bool,
}

/// Reads the changes of `worker_type`'s membership after the commit
/// `since`: the log entries after it, and the current options of each
/// worker that joined. Costs in proportion to the changes, not to the
/// number of members.
pub async fn read_membership_changes(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    since: &Versionstamp,
) -> Result<MembershipChanges, StoreError> {
    let vs = read_membership_vs(tx, ks, worker_type).await?;
    if &vs == since {
        return Ok(MembershipChanges { vs, changes: Vec::new(), complete: true });
    }
    let floor = tx
        .get(&ks.membership_log_floor(worker_type), false)
        .await?
        .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
        .map_or(0, u64::from_be_bytes);
    if crate::keyspace::version_of(since) < floor {
        // Entries after `since` may have been trimmed.
        return Ok(MembershipChanges { vs, changes: Vec::new(), complete: false });
    }
    let (_, end) = ks.membership_log_range(worker_type);
    let entries = tx.get_range(&RangeRequest::new(ks.membership_log_after(worker_type, since), end)).await?;
    let mut touched: std::collections::BTreeSet<Vec<u8>> = std::collections::BTreeSet::new();
    let mut last_entry_vs = *since;
    let mut complete = true;
    for (key, value) in &entries {
        match (ks.parse_worker_key(key), parse_change(value)) {
            (Some(crate::keyspace::WorkerKey::Log { vs: entry_vs, worker, .. }), Some(_)) => {
                last_entry_vs = entry_vs;
                touched.insert(worker);
            }
            _ => complete = false,
        }
    }
    // The log must reach the type's current vs; if it does not, entries
    // were trimmed (or the vs was written by something that keeps no log).
    if last_entry_vs != vs {
        complete = false;
    }
    let mut changes = Vec::with_capacity(touched.len());
    if complete {
        for worker in touched {
            // The member key says where the worker stands now, whatever
            // sequence of joins and leaves the log holds for it.
            let options = tx.get(&ks.member(worker_type, &worker), false).await?;
            changes.push((worker, options));
        }
    }
    Ok(MembershipChanges { vs, changes, complete })
}

/// The versionstamp of the type's last membership change (zeros if none).
pub async fn read_membership_vs(tx: &Tx, ks: &Keyspace, worker_type: &[u8]) -> Result<Versionstamp, StoreError> {
    let raw = tx.get(&ks.membership_vs(worker_type), false).await?;
    Ok(raw.and_then(|v| Versionstamp::try_from(v.as_slice()).ok()).unwrap_or([0; 10]))
}

/// A worker's decoded health record, if it is registered.
pub async fn read_health(tx: &Tx, ks: &Keyspace, worker_type: &[u8], id: &[u8]) -> Result<Option<Health>, StoreError> {
    Ok(tx.get(&ks.health(worker_type, id), false).await?.and_then(|v| Keyspace::parse_health(&v)))
}
