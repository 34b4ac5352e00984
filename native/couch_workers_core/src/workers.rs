//! Worker records: the worker keys' writes (a registration, its health
//! record, its removal), each inside a transaction of the caller's, and
//! the membership reads. See `docs/keyspace.md` for the layout. What a
//! registration's end does to the jobs it runs is `roster.rs`'s: this
//! module knows nothing of jobs.
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
use crate::keyspace::{Incarnation, Keyspace};
use crate::store::{RangeRequest, StoreError, Tx, Versionstamp, VERSIONS_PER_SECOND};

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
pub const LOG_RETENTION_VERSIONS: u64 = 60 * VERSIONS_PER_SECOND;

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
pub(crate) fn mark_health_written(tx: &Tx, ks: &Keyspace) {
    tx.set_versionstamped_value(&ks.health_vs(), &Keyspace::vs_placeholder_value());
}

pub(crate) fn write_health(tx: &Tx, ks: &Keyspace, spec: &WorkerSpec, incarnation: &Incarnation, tstamp: i64) {
    let timeout = i64::try_from(spec.timeout_s).unwrap_or(i64::MAX);
    let value = Keyspace::health_value(tstamp, timeout, incarnation);
    tx.set_versionstamped_value(&ks.health(&spec.worker_type, &spec.id), &value);
}

/// The raw health record of `(worker_type, id)`, read for a write: a
/// registration or removal of the id committed meanwhile conflicts.
pub(crate) async fn stored_health(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    id: &[u8],
) -> Result<Option<Vec<u8>>, StoreError> {
    tx.get(&ks.health(worker_type, id), false).await
}

/// Whether a stored health value belongs to `incarnation`.
pub(crate) fn held_by(value: &[u8], incarnation: &Incarnation) -> bool {
    Keyspace::parse_health(value).is_some_and(|h| h.incarnation.as_ref() == Some(incarnation))
}

/// Writes the registration of `spec` as `incarnation`: its member key, its
/// health record, a `Join` in the type's log. `true`: the id was
/// registered already, by a registration that is gone without
/// unregistering (its node restarted, or another node took the id) and is
/// replaced now; its running jobs are the caller's to fail over in this
/// transaction (`roster.rs`).
pub(crate) async fn write_registration(
    tx: &Tx,
    ks: &Keyspace,
    spec: &WorkerSpec,
    incarnation: &Incarnation,
    tstamp: i64,
) -> Result<bool, StoreError> {
    let member_key = ks.member(&spec.worker_type, &spec.id);
    let replaced = tx.get(&member_key, false).await?.is_some();
    tx.set(&member_key, &spec.options_json);
    write_health(tx, ks, spec, incarnation, tstamp);
    mark_health_written(tx, ks);
    record_change(tx, ks, &spec.worker_type, &spec.id, Change::Join).await?;
    write_seniority(tx, ks, &spec.worker_type, &spec.id, incarnation).await?;
    Ok(replaced)
}

// ---- leadership: the order of registrations ----------------------------

/// The leader of a worker type, as one read saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderRecord {
    pub id: Vec<u8>,
    /// [`epoch`] of its registration.
    pub epoch: Vec<u8>,
    /// The registration's incarnation (`None`: a value of no known shape).
    pub incarnation: Option<Incarnation>,
}

/// A registration's epoch: the 10-byte versionstamp of the commit that
/// registered it, then the worker id. Two registrations never share one
/// (one id per registration and commit), and the next leader's compares
/// greater as bytes: it registered later, or in the same commit with an
/// id that sorts after (the tuple layer keeps the bytes' order).
pub fn epoch(vs: &Versionstamp, worker: &[u8]) -> Vec<u8> {
    let mut epoch = Vec::with_capacity(vs.len() + worker.len());
    epoch.extend_from_slice(vs);
    epoch.extend_from_slice(worker);
    epoch
}

/// Writes the seniority of a new registration (its key versionstamped
/// with this commit, its incarnation as the value) and the `registered`
/// key that names it, clearing a replaced registration's first.
async fn write_seniority(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    id: &[u8],
    incarnation: &Incarnation,
) -> Result<(), StoreError> {
    clear_seniority(tx, ks, worker_type, id).await?;
    tx.set_versionstamped_value(&ks.registered(worker_type, id), &Keyspace::vs_placeholder_value());
    tx.set_versionstamped_key(&ks.seniority_new(worker_type, id), incarnation);
    Ok(())
}

/// Clears the seniority of the id's registration, if it has one (one
/// written before leadership has none: it never leads).
async fn clear_seniority(tx: &Tx, ks: &Keyspace, worker_type: &[u8], id: &[u8]) -> Result<(), StoreError> {
    let registered = ks.registered(worker_type, id);
    if let Some(raw) = tx.get(&registered, false).await? {
        if let Ok(vs) = Versionstamp::try_from(raw.as_slice()) {
            tx.clear(&ks.seniority(worker_type, &vs, id));
        }
        tx.clear(&registered);
    }
    Ok(())
}

/// The type's leader: its oldest current registration, the first key of
/// its seniority range. Read not as a snapshot (`snapshot` false), a
/// change of who leads that commits before this transaction does makes
/// it conflict: what a fenced write checks.
pub async fn read_leader(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    snapshot: bool,
) -> Result<Option<LeaderRecord>, StoreError> {
    let (begin, end) = ks.seniority_range(worker_type);
    let rows = tx.get_range(&RangeRequest::new(begin, end).limit(1).snapshot(snapshot)).await?;
    let Some((key, value)) = rows.into_iter().next() else { return Ok(None) };
    match ks.parse_worker_key(&key) {
        Some(crate::keyspace::WorkerKey::Seniority { vs, worker, .. }) => Ok(Some(LeaderRecord {
            epoch: epoch(&vs, &worker),
            id: worker,
            incarnation: Incarnation::try_from(value.as_slice()).ok(),
        })),
        _ => Err(StoreError::Invalid("a seniority key of no known shape".into())),
    }
}

/// What a heartbeat of `incarnation` does, given the health record
/// `stored` (read for a write in this transaction): renew its own record;
/// leave another incarnation's as it is (`Gone`: renewing it would keep a
/// registration alive that nobody heartbeats); register again where there
/// is none (`Reinstated`).
pub(crate) fn heartbeat_outcome(stored: Option<&[u8]>, incarnation: &Incarnation) -> Heartbeat {
    match stored {
        Some(value) if held_by(value, incarnation) => Heartbeat::Renewed,
        Some(_) => Heartbeat::Gone,
        None => Heartbeat::Reinstated,
    }
}

/// Clears the registration of `(worker_type, id)`, whichever incarnation
/// holds it: its member key, its health record, a `Leave` in the type's
/// log. `false`: not registered. Only for a caller that has judged the
/// current health record in this transaction; the registration's running
/// jobs are the caller's to move in this transaction (`roster.rs`).
pub(crate) async fn clear_registration(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    id: &[u8],
) -> Result<bool, StoreError> {
    let member_key = ks.member(worker_type, id);
    if tx.get(&member_key, false).await?.is_none() {
        return Ok(false);
    }
    tx.clear(&member_key);
    tx.clear(&ks.health(worker_type, id));
    clear_seniority(tx, ks, worker_type, id).await?;
    record_change(tx, ks, worker_type, id, Change::Leave).await?;
    Ok(true)
}

/// A removal that finds no record (the worker was reaped) still writes
/// the record's key, clearing nothing: a renewal that read the record
/// absent and reinstates it must not commit after the removal answered.
/// With this write the two conflict, whichever commits second, and the
/// renewal's retry finds the registration ended (or the removal's finds
/// it reinstated, and removes it). A transaction that writes nothing is
/// never checked for conflicts on FoundationDB (tests/workers_unregister_race.rs).
pub(crate) fn write_absent(tx: &Tx, ks: &Keyspace, worker_type: &[u8], id: &[u8]) {
    tx.clear(&ks.health(worker_type, id));
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

/// A worker's decoded health record, if it is registered (for the tests).
#[cfg(any(test, feature = "internals"))]
pub async fn read_health(
    tx: &Tx,
    ks: &Keyspace,
    worker_type: &[u8],
    id: &[u8],
) -> Result<Option<crate::keyspace::Health>, StoreError> {
    Ok(tx.get(&ks.health(worker_type, id), false).await?.and_then(|v| Keyspace::parse_health(&v)))
}
