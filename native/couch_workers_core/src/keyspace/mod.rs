//! The key space, packed with the FoundationDB tuple layer: every key's
//! bytes are built here, each function naming the tuple it packs. What
//! each key and value is for, and the values' formats: `docs/keyspace.md`
//! (the one description); `tests/keyspace_vectors/` pins the bytes. The
//! workers', leadership's, receipts' and reapers' keys are here, the job
//! queue's in `jobs.rs`, the recurring jobs' in `recurring.rs`, the counts
//! of job calls in callers' transactions in `tx_counts.rs`.

use foundationdb_tuple::{pack_with_versionstamp, unpack, Bytes, Subspace, Versionstamp as TupleVersionstamp};

use crate::store::receipt::ReceiptKeys;
use crate::store::{Versionstamp, VERSIONSTAMP_LEN};

mod jobs;
mod recurring;
mod tx_counts;
// Activity timeouts' index of running jobs.
mod activity;
pub use activity::TypeTimeouts;

const ROOT: &[u8] = b"couch_workers";
const WORKERS: &[u8] = b"workers";
const JOBS: &[u8] = b"jobs";
const PENDING: &[u8] = b"pending";
const ACTIVE: &[u8] = b"active";
const COUNTS: &[u8] = b"counts";
const SCHEDULED: &[u8] = b"scheduled";
const BY_STATE: &[u8] = b"by_state";
const TYPES: &[u8] = b"types";
const EXPIRY: &[u8] = b"expiry";
const PAUSED: &[u8] = b"paused";
const JOBS_VS: &[u8] = b"jobs_vs";
const ORPHANS: &[u8] = b"orphans";
const ORPHANS_VS: &[u8] = b"orphans_vs";
const RECEIPTS: &[u8] = b"receipts";
const REAPER_PULSE: &[u8] = b"reaper_pulse";
const HEALTH_VS: &[u8] = b"health_vs";
const SCHEDULED_VS: &[u8] = b"scheduled_vs";
const EXPIRY_VS: &[u8] = b"expiry_vs";
const SCHEDULES: &[u8] = b"schedules";
const SCHEDULE_DUE: &[u8] = b"schedule_due";
const SCHEDULES_VS: &[u8] = b"schedules_vs";
const VS: &[u8] = b"vs";
const MEMBER: &[u8] = b"member";
const HEALTH: &[u8] = b"health";
const LOG: &[u8] = b"log";
const LOG_FLOOR: &[u8] = b"log_floor";
const REGISTERED: &[u8] = b"registered";
const SENIORITY: &[u8] = b"seniority";

/// The keys strictly inside a packed tuple prefix: `prefix ++ 0x00` up to
/// `prefix ++ 0xff` (foundationdb-rs `Subspace::range`, erlfdb
/// `erlfdb_tuple:range/1`). Not `strinc(prefix)`: a byte-string element
/// ends with a 0x00 terminator, so `strinc` of the prefix for id `w` would
/// also cover the id `w\x00...` (packed `w\x00\xff...`).
fn tuple_range(prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut begin = prefix.to_vec();
    begin.push(0x00);
    let mut end = prefix.to_vec();
    end.push(0xff);
    (begin, end)
}

fn b(bytes: &[u8]) -> Bytes<'_> {
    Bytes::from(bytes)
}

/// Builds the keys of one store's key space.
#[derive(Debug, Clone)]
pub struct Keyspace {
    /// prefix ++ pack(("couch_workers",))
    root: Subspace,
    /// The job types' default activity timeouts as this node last read
    /// them (`activity.rs`), shared by the clones of one context's key
    /// space: what `jobs/place.rs`, which reads nothing, indexes by.
    type_timeouts: std::sync::Arc<TypeTimeouts>,
}

/// What a key under `("couch_workers", "workers")` is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerKey {
    Vs {
        worker_type: Vec<u8>,
    },
    Member {
        worker_type: Vec<u8>,
        worker: Vec<u8>,
    },
    Health {
        worker_type: Vec<u8>,
        worker: Vec<u8>,
    },
    /// The version below which the type's log has been trimmed.
    LogFloor {
        worker_type: Vec<u8>,
    },
    /// A membership change log entry: the 10-byte commit VS and the worker.
    Log {
        worker_type: Vec<u8>,
        vs: Versionstamp,
        worker: Vec<u8>,
    },
    /// The commit VS of a worker's current registration.
    Registered {
        worker_type: Vec<u8>,
        worker: Vec<u8>,
    },
    /// A registration in the order of its commit: the oldest leads.
    Seniority {
        worker_type: Vec<u8>,
        vs: Versionstamp,
        worker: Vec<u8>,
    },
}

/// Tells one registration of a worker id from another (16 random bytes).
pub type Incarnation = [u8; INCARNATION_LEN];

/// Bytes of an [`Incarnation`].
pub const INCARNATION_LEN: usize = 16;

/// A decoded health record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    pub versionstamp: Versionstamp,
    /// Wall clock seconds of the writer: informational only.
    pub tstamp: i64,
    /// Health timeout, seconds.
    pub timeout_s: i64,
    /// The registration the record belongs to; `None` in a record written
    /// before incarnations, which belongs to no registration of this code.
    pub incarnation: Option<Incarnation>,
}

impl Health {
    /// The commit version of the heartbeat (the first 8 bytes of its VS).
    pub fn version(&self) -> u64 {
        version_of(&self.versionstamp)
    }
}

/// The commit version inside a versionstamp.
pub fn version_of(vs: &Versionstamp) -> u64 {
    u64::from_be_bytes(vs[0..8].try_into().expect("8 bytes"))
}

impl Keyspace {
    /// The key space under `prefix` (the directory's prefix; empty for the
    /// embedded store).
    pub fn new(prefix: &[u8]) -> Self {
        let root = Subspace::from_bytes(prefix.to_vec()).subspace(&(b(ROOT),));
        Keyspace { root, type_timeouts: std::sync::Arc::default() }
    }

    /// Every key of couch_workers: `prefix ++ pack(("couch_workers",))`.
    pub fn root_range(&self) -> (Vec<u8>, Vec<u8>) {
        tuple_range(self.root.bytes())
    }

    // ---- workers ------------------------------------------------------

    /// `("couch_workers", "workers", WorkerType, "vs")`
    pub fn membership_vs(&self, worker_type: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(WORKERS), b(worker_type), b(VS)))
    }

    /// `("couch_workers", "workers", WorkerType, "member", Worker)`
    pub fn member(&self, worker_type: &[u8], worker: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(WORKERS), b(worker_type), b(MEMBER), b(worker)))
    }

    /// `("couch_workers", "workers", WorkerType)`: every key of one type.
    pub fn worker_type_prefix(&self, worker_type: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(WORKERS), b(worker_type)))
    }

    /// Every key of one worker type.
    pub fn worker_type_range(&self, worker_type: &[u8]) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.worker_type_prefix(worker_type))
    }

    /// Every member key of one worker type.
    pub fn members_range(&self, worker_type: &[u8]) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.root.pack(&(b(WORKERS), b(worker_type), b(MEMBER))))
    }

    /// `("couch_workers", "workers", WorkerType, "health", Worker)`
    pub fn health(&self, worker_type: &[u8], worker: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(WORKERS), b(worker_type), b(HEALTH), b(worker)))
    }

    /// Every health key of one worker type.
    pub fn health_range(&self, worker_type: &[u8]) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.root.pack(&(b(WORKERS), b(worker_type), b(HEALTH))))
    }

    /// Every key of every worker type (the reaper scans it in batches).
    pub fn all_workers_range(&self) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.root.pack(&(b(WORKERS),)))
    }

    /// Decodes a key under `("couch_workers", "workers")`; `None` for any
    /// other key.
    pub fn parse_worker_key(&self, key: &[u8]) -> Option<WorkerKey> {
        let rest = key.strip_prefix(self.root.bytes())?;
        if let Ok((w, t, kind, id)) = unpack::<(Bytes, Bytes, Bytes, Bytes)>(rest) {
            if &*w != WORKERS {
                return None;
            }
            return match &*kind {
                MEMBER => Some(WorkerKey::Member { worker_type: t.into_owned(), worker: id.into_owned() }),
                HEALTH => Some(WorkerKey::Health { worker_type: t.into_owned(), worker: id.into_owned() }),
                REGISTERED => Some(WorkerKey::Registered { worker_type: t.into_owned(), worker: id.into_owned() }),
                _ => None,
            };
        }
        if let Ok((w, t, kind, vs, id)) = unpack::<(Bytes, Bytes, Bytes, TupleVersionstamp, Bytes)>(rest) {
            let vs: Versionstamp = vs.transaction_version().try_into().ok()?;
            if &*w != WORKERS {
                return None;
            }
            let (worker_type, worker) = (t.into_owned(), id.into_owned());
            return match &*kind {
                LOG => Some(WorkerKey::Log { worker_type, vs, worker }),
                SENIORITY => Some(WorkerKey::Seniority { worker_type, vs, worker }),
                _ => None,
            };
        }
        let (w, t, kind) = unpack::<(Bytes, Bytes, Bytes)>(rest).ok()?;
        if &*w != WORKERS {
            return None;
        }
        match &*kind {
            VS => Some(WorkerKey::Vs { worker_type: t.into_owned() }),
            LOG_FLOOR => Some(WorkerKey::LogFloor { worker_type: t.into_owned() }),
            _ => None,
        }
    }

    /// `("couch_workers", "workers", WorkerType, "log_floor")`: the version
    /// (8 bytes, big-endian) below which log entries have been trimmed; a
    /// reader whose last versionstamp is older must read every member.
    pub fn membership_log_floor(&self, worker_type: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(WORKERS), b(worker_type), b(LOG_FLOOR)))
    }

    /// `("couch_workers", "workers", WorkerType, "log", VS, Worker)` with an
    /// incomplete versionstamp, for `set_versionstamped_key`: one entry per
    /// member-set change, so that watchers read what changed rather than
    /// the whole member range. The worker id in the key keeps entries of
    /// one commit apart.
    pub fn membership_log_new(&self, worker_type: &[u8], worker: &[u8]) -> Vec<u8> {
        self.root.pack_with_versionstamp(&(
            b(WORKERS),
            b(worker_type),
            b(LOG),
            TupleVersionstamp::incomplete(0),
            b(worker),
        ))
    }

    /// The first log key after every entry of the commit `vs`.
    pub fn membership_log_after(&self, worker_type: &[u8], vs: &Versionstamp) -> Vec<u8> {
        self.root.pack(&(b(WORKERS), b(worker_type), b(LOG), TupleVersionstamp::complete(*vs, u16::MAX)))
    }

    /// The first log key of commits at or after `version`: entries before
    /// it are older than `version` (used to trim the log).
    pub fn membership_log_at_version(&self, worker_type: &[u8], version: u64) -> Vec<u8> {
        let mut vs = [0u8; VERSIONSTAMP_LEN];
        vs[..8].copy_from_slice(&version.to_be_bytes());
        self.root.pack(&(b(WORKERS), b(worker_type), b(LOG), TupleVersionstamp::complete(vs, 0)))
    }

    /// Every log key of one worker type.
    pub fn membership_log_range(&self, worker_type: &[u8]) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.root.pack(&(b(WORKERS), b(worker_type), b(LOG))))
    }

    // ---- leadership ---------------------------------------------------

    /// `("couch_workers", "workers", WorkerType, "registered", Worker)`:
    /// the 10-byte commit versionstamp of the worker's current
    /// registration (a bare VS value, [`Keyspace::vs_placeholder_value`]),
    /// which names its [`Keyspace::seniority`] key, so that a removal
    /// clears it without a scan.
    pub fn registered(&self, worker_type: &[u8], worker: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(WORKERS), b(worker_type), b(REGISTERED), b(worker)))
    }

    /// `("couch_workers", "workers", WorkerType, "seniority", VS, Worker)`
    /// with an incomplete versionstamp (user version 0), for
    /// `set_versionstamped_key`, written with the registration. The first
    /// key of [`Keyspace::seniority_range`] is the type's leader.
    pub fn seniority_new(&self, worker_type: &[u8], worker: &[u8]) -> Vec<u8> {
        self.root.pack_with_versionstamp(&(
            b(WORKERS),
            b(worker_type),
            b(SENIORITY),
            TupleVersionstamp::incomplete(0),
            b(worker),
        ))
    }

    /// The seniority key of the registration committed at `vs`.
    pub fn seniority(&self, worker_type: &[u8], vs: &Versionstamp, worker: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(WORKERS), b(worker_type), b(SENIORITY), TupleVersionstamp::complete(*vs, 0), b(worker)))
    }

    /// Every seniority key of one worker type, oldest registration first.
    pub fn seniority_range(&self, worker_type: &[u8]) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.root.pack(&(b(WORKERS), b(worker_type), b(SENIORITY))))
    }

    /// The health value to write with `set_versionstamped_value`: the
    /// packed tuple `(incomplete VS, tstamp, timeout, incarnation)` plus
    /// the 4-byte offset of the placeholder.
    pub fn health_value(tstamp: i64, timeout_s: i64, incarnation: &Incarnation) -> Vec<u8> {
        pack_with_versionstamp(&(TupleVersionstamp::incomplete(0), tstamp, timeout_s, b(incarnation)))
    }

    /// Decodes a health value written by [`Keyspace::health_value`], or
    /// one of three elements written before incarnations (`incarnation:
    /// None`). An incarnation of another length is no record of ours.
    pub fn parse_health(value: &[u8]) -> Option<Health> {
        let (vs, tstamp, timeout_s, incarnation) = match unpack::<(TupleVersionstamp, i64, i64, Bytes)>(value) {
            Ok((vs, t, timeout, inc)) => (vs, t, timeout, Some(Incarnation::try_from(&*inc).ok()?)),
            Err(_) => {
                let (vs, t, timeout) = unpack::<(TupleVersionstamp, i64, i64)>(value).ok()?;
                (vs, t, timeout, None)
            }
        };
        let versionstamp: Versionstamp = vs.transaction_version().try_into().ok()?;
        Some(Health { versionstamp, tstamp, timeout_s, incarnation })
    }

    /// The membership VS value: a 10-byte placeholder plus its offset (0),
    /// for `set_versionstamped_value`.
    pub fn vs_placeholder_value() -> Vec<u8> {
        let mut v = vec![0xff; VERSIONSTAMP_LEN];
        v.extend_from_slice(&0u32.to_le_bytes());
        v
    }

    // ---- receipts -----------------------------------------------------

    /// `("couch_workers", "receipts", Minute, Token)`: written by a job
    /// write in its own transaction, so that a retry after
    /// `commit_unknown_result` can tell whether its earlier attempt landed.
    /// `Minute` (Unix minutes of the writer's clock) lets old receipts go
    /// with one range clear.
    pub fn receipt(&self, minute: i64, token: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(RECEIPTS), minute, b(token)))
    }

    /// Every receipt written in a minute before `minute`.
    pub fn receipts_before(&self, minute: i64) -> (Vec<u8>, Vec<u8>) {
        let (begin, _) = tuple_range(&self.root.pack(&(b(RECEIPTS),)));
        (begin, self.root.pack(&(b(RECEIPTS), minute)))
    }

    // ---- reapers ------------------------------------------------------

    /// `("couch_workers", "reaper_pulse")`: every reaper pass adds 1 to it
    /// (an atomic add: reapers never conflict on it). The write makes the
    /// pass's first transaction a real commit, which shows that the store
    /// takes writes and moves FoundationDB's versions, which otherwise
    /// stand still while nothing commits (`services/reaper.rs`).
    pub fn reaper_pulse(&self) -> Vec<u8> {
        self.root.pack(&(b(REAPER_PULSE),))
    }

    /// `("couch_workers", "health_vs")`: the versionstamp of the last
    /// transaction that wrote a health record (a registration, or a
    /// heartbeat transaction, once per transaction). Reapers watch it, so
    /// that they look when a record changed rather than on a timer.
    pub fn health_vs(&self) -> Vec<u8> {
        self.root.pack(&(b(HEALTH_VS),))
    }

    /// `("couch_workers", "scheduled_vs")`: the versionstamp of the last
    /// transaction that scheduled a job before every scheduled job of its
    /// type (the same condition that bumps the type's `jobs_vs`). Every
    /// node's promoter watches it, so that it sleeps until the earliest
    /// `run_at` of every type, a new type's first schedule included.
    pub fn scheduled_vs(&self) -> Vec<u8> {
        self.root.pack(&(b(SCHEDULED_VS),))
    }

    /// `("couch_workers", "expiry_vs")`: the versionstamp of the last
    /// transaction that ended a job with a `keep` shorter than
    /// `jobs::place::WAKE_KEEP_S`. Every node's pruner watches it.
    pub fn expiry_vs(&self) -> Vec<u8> {
        self.root.pack(&(b(EXPIRY_VS),))
    }
}

/// The receipts' keys, for the retry-safe write of the store layer.
impl ReceiptKeys for Keyspace {
    fn receipt(&self, minute: i64, token: &[u8]) -> Vec<u8> {
        Keyspace::receipt(self, minute, token)
    }

    fn receipts_before(&self, minute: i64) -> (Vec<u8>, Vec<u8>) {
        Keyspace::receipts_before(self, minute)
    }
}

// ---- operations (`inspect.rs`) ----------------------------------------------

impl Keyspace {
    /// Every active key of one worker type: the running jobs of all its
    /// workers, grouped by worker.
    pub fn active_type_range(&self, worker_type: &[u8]) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.root.pack(&(b(ACTIVE), b(worker_type))))
    }

    /// Decodes an active key of `worker_type`: `(worker, job id)`.
    pub fn parse_active(&self, worker_type: &[u8], key: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
        let rest = key.strip_prefix(self.root.bytes())?;
        let (a, t, w, id) = unpack::<(Bytes, Bytes, Bytes, Bytes)>(rest).ok()?;
        (&*a == ACTIVE && &*t == worker_type).then(|| (w.into_owned(), id.into_owned()))
    }

    /// The job type and id of a job record's key.
    pub fn parse_job_key(&self, key: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
        let rest = key.strip_prefix(self.root.bytes())?;
        let (j, t, id) = unpack::<(Bytes, Bytes, Bytes)>(rest).ok()?;
        (&*j == JOBS).then(|| (t.into_owned(), id.into_owned()))
    }

    /// The worker type of any key under `("couch_workers", "workers")`,
    /// whatever follows the type (so that a scan can skip from one type
    /// to the next); `None` for any other key.
    pub fn worker_type_of(&self, key: &[u8]) -> Option<Vec<u8>> {
        use foundationdb_tuple::Element;
        let rest = key.strip_prefix(self.root.bytes())?;
        let elements = unpack::<Vec<Element>>(rest).ok()?;
        match elements.as_slice() {
            [Element::Bytes(w), Element::Bytes(t), ..] if &**w == WORKERS => Some(t.to_vec()),
            _ => None,
        }
    }
}
