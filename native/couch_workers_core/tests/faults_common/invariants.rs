//! The key space read whole in one snapshot, decoded independently of the
//! crate, and the invariants every fault test checks over it.

use std::collections::{BTreeMap, BTreeSet};

use couch_workers_core::keyspace::Keyspace;
use couch_workers_core::store::{run, Database, RangeRequest, TxOptions};
use foundationdb_tuple::{unpack, Element};

/// A job record, decoded here independently of the crate's decoder
/// (`jobs/record/` formats 1 to 7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rec {
    pub state: String,
    pub worker: Option<Vec<u8>>,
    pub priority: i64,
    pub attempts: i64,
    pub token: Option<Vec<u8>>,
    pub cancel_requested: bool,
    pub vs: Vec<u8>,
    /// Format 2: when a scheduled job falls due.
    pub run_at: Option<i64>,
    /// Format 2: when an ended job is pruned.
    pub expire_at: Option<i64>,
    /// Format 3: since when a pending or scheduled job can be accepted.
    pub queued_at: Option<i64>,
    /// Format 4: which job of its id it is (8 bytes, or nil for a job
    /// first written in an older format).
    pub incarnation: Option<Vec<u8>>,
    /// Format 5 and 6: the job's unique key.
    pub unique: Option<Vec<u8>>,
    /// Format 6 and 7: the job's group.
    pub group: Option<Vec<u8>>,
    /// Format 7: when its current or last run started.
    pub run_started_at: Option<i64>,
    /// Format 7: whether its last run ended (worker, end and outcome all
    /// there, or none).
    pub run_ended: bool,
}

fn decode_record(value: &[u8]) -> Result<Rec, String> {
    let e: Vec<Element> = unpack(value).map_err(|e| format!("not a tuple: {e}"))?;
    match (e[0].as_i64(), e.len()) {
        (Some(1), 10)
        | (Some(2), 16)
        | (Some(3), 17)
        | (Some(4), 18)
        | (Some(5), 19)
        | (Some(6), 21)
        | (Some(7), 25) => {}
        _ => return Err(format!("not a format-1 to -7 record ({} elements)", e.len())),
    }
    let opt_int = |i: usize| -> Result<Option<i64>, String> {
        match e.get(i) {
            None | Some(Element::Nil) => Ok(None),
            Some(el) => el.as_i64().map(Some).ok_or_else(|| format!("element {i} not an integer")),
        }
    };
    let (run_at, expire_at, queued_at) = (opt_int(12)?, opt_int(14)?, opt_int(16)?);
    let bytes = |el: &Element| -> Result<Option<Vec<u8>>, String> {
        match el {
            Element::Nil => Ok(None),
            Element::Bytes(b) => Ok(Some(b.to_vec())),
            other => Err(format!("expected bytes or nil, got {other:?}")),
        }
    };
    let state = bytes(&e[1])?.ok_or("nil state")?;
    let incarnation = match e.get(17) {
        None => None,
        Some(el) => bytes(el)?,
    };
    if incarnation.as_ref().is_some_and(|i| i.len() != 8) {
        return Err("incarnation not 8 bytes".into());
    }
    Ok(Rec {
        state: String::from_utf8_lossy(&state).into_owned(),
        worker: bytes(&e[2])?,
        priority: e[3].as_i64().ok_or("priority")?,
        attempts: e[4].as_i64().ok_or("attempts")?,
        token: bytes(&e[5])?,
        cancel_requested: e[6].as_bool().ok_or("cancel_requested")?,
        vs: e[7].as_versionstamp().ok_or("vs")?.as_bytes().to_vec(),
        run_at,
        expire_at,
        queued_at,
        incarnation,
        unique: match (e.get(18), e.len()) {
            (None, _) => None,
            // Format 6 and 7: each of its three elements may be nil.
            (Some(el), 21 | 25) => {
                bytes(&e[19])?;
                opt_int(20)?;
                bytes(el)?
            }
            (Some(el), _) => Some(bytes(el)?.ok_or("nil unique key")?),
        },
        group: match e.len() {
            21 | 25 => bytes(&e[19])?,
            _ => None,
        },
        run_started_at: opt_int(21)?,
        run_ended: match (e.get(22), opt_int(23)?, e.get(24)) {
            (None, _, _) => false,
            (Some(w), end, Some(o)) => match (bytes(w)?, end, bytes(o)?) {
                (None, None, None) => false,
                (Some(_), Some(_), Some(_)) => true,
                _ => return Err("a run's end in part".into()),
            },
            _ => return Err("a run's end in part".into()),
        },
    })
}

fn elem_bytes(el: &Element) -> Option<Vec<u8>> {
    el.as_bytes().map(|b| b.to_vec())
}

/// `(type, id)` of a job.
pub type JobKey = (Vec<u8>, Vec<u8>);

/// Everything under `("couch_workers")`, read in one transaction.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// (type, id) → record (or why it does not decode).
    pub jobs: BTreeMap<JobKey, Result<Rec, String>>,
    /// (type, id) → the (priority, vs) of each pending key.
    pub pending: BTreeMap<JobKey, Vec<(i64, Vec<u8>)>>,
    /// (type, id) → the workers of its active keys.
    pub active: BTreeMap<JobKey, Vec<Vec<u8>>>,
    /// type → the pending counter.
    pub counts: BTreeMap<Vec<u8>, i64>,
    /// (type, state) → the state's counter (pending included).
    pub state_counts: BTreeMap<(Vec<u8>, String), i64>,
    /// (type, state) → the ids in that state's index.
    pub by_state: BTreeMap<(Vec<u8>, String), BTreeSet<Vec<u8>>>,
    /// (type, id) → the run_at of each scheduled key.
    pub scheduled: BTreeMap<JobKey, Vec<i64>>,
    /// (type, id) → the expire_at of each expiry key.
    pub expiry: BTreeMap<JobKey, Vec<i64>>,
    /// type → its job count.
    pub type_counts: BTreeMap<Vec<u8>, i64>,
    pub members: BTreeMap<Vec<u8>, BTreeSet<Vec<u8>>>,
    pub health: BTreeMap<Vec<u8>, BTreeSet<Vec<u8>>>,
    /// type → the workers with a `registered` key, and with a
    /// `seniority` key (the leadership order).
    pub registered: BTreeMap<Vec<u8>, BTreeSet<Vec<u8>>>,
    pub seniority: BTreeMap<Vec<u8>, Vec<Vec<u8>>>,
    pub orphans: Vec<(Vec<u8>, Vec<u8>)>,
    /// (type, id) → the (run, part) of each of its history keys.
    pub history: BTreeMap<JobKey, BTreeSet<(i64, i64)>>,
    /// (type, unique key) → the id its key names.
    pub uniques: BTreeMap<(Vec<u8>, Vec<u8>), Vec<u8>>,
    /// (type, group) → the group's running counter.
    pub group_running: BTreeMap<(Vec<u8>, Vec<u8>), i64>,
    /// Keys of no known shape.
    pub unknown: Vec<Vec<u8>>,
}

pub async fn snapshot(db: &dyn Database, ks: &Keyspace) -> Snapshot {
    let (begin, end) = ks.root_range();
    let root_len = begin.len() - 1;
    let rows = run(db, TxOptions::read(), |tx| {
        let r = RangeRequest::new(begin.clone(), end.clone());
        async move { tx.get_range(&r).await }
    })
    .await
    .expect("read the whole key space");
    let mut s = Snapshot::default();
    for (key, value) in rows {
        let Ok(el) = unpack::<Vec<Element>>(&key[root_len..]) else {
            s.unknown.push(key);
            continue;
        };
        let name = el.first().and_then(elem_bytes).unwrap_or_default();
        let b = |i: usize| el.get(i).and_then(elem_bytes);
        match (name.as_slice(), el.len()) {
            (b"jobs", 3) => {
                s.jobs.insert((b(1).unwrap_or_default(), b(2).unwrap_or_default()), decode_record(&value));
            }
            (b"pending", 5) => {
                let prio = el[2].as_i64().unwrap_or(i64::MIN);
                let vs = el[3].as_versionstamp().map(|v| v.as_bytes().to_vec()).unwrap_or_default();
                s.pending.entry((b(1).unwrap_or_default(), b(4).unwrap_or_default())).or_default().push((prio, vs));
            }
            (b"active", 4) => {
                s.active
                    .entry((b(1).unwrap_or_default(), b(3).unwrap_or_default()))
                    .or_default()
                    .push(b(2).unwrap_or_default());
            }
            (b"counts", 3) => {
                let state = show(&b(2).unwrap_or_default());
                if state == "pending" {
                    s.counts.insert(b(1).unwrap_or_default(), le_i64(&value));
                }
                s.state_counts.insert((b(1).unwrap_or_default(), state), le_i64(&value));
            }
            (b"by_state", 4) => {
                s.by_state
                    .entry((b(1).unwrap_or_default(), show(&b(2).unwrap_or_default())))
                    .or_default()
                    .insert(b(3).unwrap_or_default());
            }
            (b"scheduled", 4) => {
                let at = el[2].as_i64().unwrap_or(i64::MIN);
                s.scheduled.entry((b(1).unwrap_or_default(), b(3).unwrap_or_default())).or_default().push(at);
            }
            (b"expiry", 4) => {
                let at = el[1].as_i64().unwrap_or(i64::MIN);
                s.expiry.entry((b(2).unwrap_or_default(), b(3).unwrap_or_default())).or_default().push(at);
            }
            (b"types", 2) => {
                s.type_counts.insert(b(1).unwrap_or_default(), le_i64(&value));
            }
            (b"paused", 2) | (b"type_settings", 2) => {}
            (b"history", 5) => {
                let run = (el[3].as_i64().unwrap_or(i64::MIN), el[4].as_i64().unwrap_or(i64::MIN));
                s.history.entry((b(1).unwrap_or_default(), b(2).unwrap_or_default())).or_default().insert(run);
            }
            (b"unique", 3) => {
                s.uniques.insert((b(1).unwrap_or_default(), b(2).unwrap_or_default()), value.clone());
            }
            (b"workers", 4) if b(2).as_deref() == Some(b"member") => {
                s.members.entry(b(1).unwrap_or_default()).or_default().insert(b(3).unwrap_or_default());
            }
            (b"workers", 4) if b(2).as_deref() == Some(b"health") => {
                s.health.entry(b(1).unwrap_or_default()).or_default().insert(b(3).unwrap_or_default());
            }
            (b"workers", 3)
            | (b"jobs_vs", 2)
            | (b"orphans_vs", 1)
            | (b"reaper_pulse", 1)
            | (b"health_vs", 1)
            | (b"scheduled_vs", 1)
            | (b"expiry_vs", 1) => {}
            // A job write's receipt (minute, token): kept 10 minutes.
            (b"receipts", 3) => {}
            // The membership change log: (workers, T, log, VS, Worker).
            (b"workers", 5) if b(2).as_deref() == Some(b"log") => {}
            (b"workers", 4) if b(2).as_deref() == Some(b"registered") => {
                s.registered.entry(b(1).unwrap_or_default()).or_default().insert(b(3).unwrap_or_default());
            }
            (b"workers", 5) if b(2).as_deref() == Some(b"seniority") => {
                s.seniority.entry(b(1).unwrap_or_default()).or_default().push(b(4).unwrap_or_default());
            }
            // Recurring jobs: a record, its due key, the runners' key.
            (b"schedules", 3) | (b"schedule_due", 4) | (b"schedules_vs", 1) => {}
            (b"orphans", 3) => s.orphans.push((b(1).unwrap_or_default(), b(2).unwrap_or_default())),
            (b"group_running", 3) => {
                s.group_running.insert((b(1).unwrap_or_default(), b(2).unwrap_or_default()), le_i64(&value));
            }
            _ => s.unknown.push(key.clone()),
        }
    }
    s
}

fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn le_i64(value: &[u8]) -> i64 {
    let mut le = [0u8; 8];
    let n = value.len().min(8);
    le[..n].copy_from_slice(&value[..n]);
    i64::from_le_bytes(le)
}

impl Snapshot {
    /// Every violation of the key space's invariants (empty: all hold).
    ///
    /// * every job record decodes and is in exactly one state: pending
    ///   with exactly one pending key (same priority and VS) and no active
    ///   key; running with a worker, a token, exactly one active key, for
    ///   a live member, and no pending key; finished or canceled with
    ///   neither;
    /// * every pending key and every active key belongs to such a record;
    /// * each type's pending counter equals its pending keys and records;
    /// * member and health records come in pairs; each registration's
    ///   `seniority` key is named by its `registered` key, for a member;
    ///   no orphan marker is left; no key of unknown shape;
    /// * (format 2) each state's counter equals its records, each state's
    ///   index lists exactly its records, a scheduled record has exactly
    ///   its scheduled key, an ended record with an expiry exactly its
    ///   expiry key, and each type's job count equals its records.
    pub fn violations(&self) -> Vec<String> {
        let mut v = self.index_violations();
        v.extend(self.group_violations());
        v.extend(self.controls_violations());
        let mut pending_records: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
        for ((t, id), rec) in &self.jobs {
            let who = format!("job {}/{}", show(t), show(id));
            let rec = match rec {
                Ok(rec) => rec,
                Err(e) => {
                    v.push(format!("{who}: undecodable record: {e}"));
                    continue;
                }
            };
            let pend = self.pending.get(&(t.clone(), id.clone())).cloned().unwrap_or_default();
            let act = self.active.get(&(t.clone(), id.clone())).cloned().unwrap_or_default();
            // Format 3: a queued job has its QueuedAt (a scheduled one its
            // RunAt), nothing else has one.
            let queued_ok = match rec.state.as_str() {
                "pending" => rec.queued_at.is_some(),
                "scheduled" => rec.queued_at == rec.run_at,
                _ => rec.queued_at.is_none(),
            };
            if !queued_ok {
                v.push(format!("{who}: {} with queued_at {:?} (run_at {:?})", rec.state, rec.queued_at, rec.run_at));
            }
            match rec.state.as_str() {
                "pending" => {
                    *pending_records.entry(t.clone()).or_default() += 1;
                    if pend.len() != 1 {
                        v.push(format!("{who}: pending with {} pending keys", pend.len()));
                    } else if pend[0] != (rec.priority, rec.vs.clone()) {
                        v.push(format!("{who}: pending key {:?} does not match the record", pend[0]));
                    }
                    if !act.is_empty() || rec.worker.is_some() || rec.token.is_some() {
                        v.push(format!("{who}: pending but has a worker, token or active key"));
                    }
                }
                "running" => {
                    let (Some(w), Some(_)) = (&rec.worker, &rec.token) else {
                        v.push(format!("{who}: running without worker or token"));
                        continue;
                    };
                    if act != vec![w.clone()] {
                        v.push(format!(
                            "{who}: running for {} but active keys for {:?}",
                            show(w),
                            act.iter().map(|a| show(a)).collect::<Vec<_>>()
                        ));
                    }
                    if !self.members.get(t).is_some_and(|m| m.contains(w)) {
                        v.push(format!("{who}: running for {}, which is not a member", show(w)));
                    }
                    if !pend.is_empty() {
                        v.push(format!("{who}: running but has a pending key"));
                    }
                }
                "finished" | "canceled" | "failed" | "scheduled" => {
                    if !pend.is_empty() || !act.is_empty() || rec.worker.is_some() || rec.token.is_some() {
                        v.push(format!("{who}: {} but still indexed or owned", rec.state));
                    }
                }
                other => v.push(format!("{who}: unknown state {other}")),
            }
        }
        for ((t, id), keys) in &self.pending {
            if !self.jobs.contains_key(&(t.clone(), id.clone())) {
                v.push(format!("{} pending key(s) without a record: {}/{}", keys.len(), show(t), show(id)));
            }
        }
        for ((t, id), workers) in &self.active {
            if !self.jobs.contains_key(&(t.clone(), id.clone())) {
                v.push(format!("{} active key(s) without a record: {}/{}", workers.len(), show(t), show(id)));
            }
        }
        let mut types: BTreeSet<Vec<u8>> = self.counts.keys().cloned().collect();
        types.extend(self.jobs.keys().map(|(t, _)| t.clone()));
        for t in types {
            let counter = self.counts.get(&t).copied().unwrap_or(0);
            let keys: i64 = self.pending.iter().filter(|((pt, _), _)| *pt == t).map(|(_, k)| k.len() as i64).sum();
            let records = pending_records.get(&t).copied().unwrap_or(0);
            if counter != keys || keys != records {
                v.push(format!(
                    "type {}: pending counter {counter}, pending keys {keys}, pending records {records}",
                    show(&t)
                ));
            }
        }
        let no_set = BTreeSet::new();
        let mut wtypes: BTreeSet<&Vec<u8>> = self.members.keys().collect();
        wtypes.extend(self.health.keys());
        for t in wtypes {
            let m = self.members.get(t).unwrap_or(&no_set);
            let h = self.health.get(t).unwrap_or(&no_set);
            if m != h {
                v.push(format!("worker type {}: members {} vs health records {}", show(t), m.len(), h.len()));
            }
        }
        // Every registration's seniority key is named by its registered
        // key, one per worker, and belongs to a member (a registration
        // written before them has neither).
        let mut ltypes: BTreeSet<&Vec<u8>> = self.registered.keys().collect();
        ltypes.extend(self.seniority.keys());
        for t in ltypes {
            let r = self.registered.get(t).unwrap_or(&no_set);
            let sen = self.seniority.get(t).cloned().unwrap_or_default();
            let sen_set: BTreeSet<Vec<u8>> = sen.iter().cloned().collect();
            let m = self.members.get(t).unwrap_or(&no_set);
            if sen.len() != sen_set.len() || &sen_set != r || !r.is_subset(m) {
                v.push(format!(
                    "worker type {}: registered {} vs seniority keys {} ({} distinct) vs members {}",
                    show(t),
                    r.len(),
                    sen.len(),
                    sen_set.len(),
                    m.len()
                ));
            }
        }
        if !self.orphans.is_empty() {
            v.push(format!("{} orphan marker(s) left", self.orphans.len()));
        }
        if !self.unknown.is_empty() {
            v.push(format!("{} key(s) of unknown shape", self.unknown.len()));
        }
        v
    }

    /// The format-2 indexes and counters against the records.
    /// Unique keys and run history: a unique key names an unended job
    /// that has that key, and every unended job with a key holds it; a
    /// history belongs to a job, keeps at most 10 runs (its keys and the
    /// run its record holds), and a running job's record has the start of
    /// its current run and no end.
    fn controls_violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        for ((t, key), id) in &self.uniques {
            let holds = match self.jobs.get(&(t.clone(), id.clone())) {
                Some(Ok(rec)) => {
                    !matches!(rec.state.as_str(), "finished" | "canceled" | "failed")
                        && rec.unique.as_deref() == Some(key.as_slice())
                }
                _ => false,
            };
            if !holds {
                v.push(format!("unique key {}/{} names {}, which does not hold it", show(t), show(key), show(id)));
            }
        }
        for ((t, id), rec) in &self.jobs {
            let Ok(rec) = rec else { continue };
            if let Some(key) = &rec.unique {
                let unended = !matches!(rec.state.as_str(), "finished" | "canceled" | "failed");
                let stored = self.uniques.get(&(t.clone(), key.clone()));
                if unended && stored != Some(id) {
                    v.push(format!("job {}/{}: {} without its unique key", show(t), show(id), rec.state));
                }
            }
            // (A run an older version started has its start in a key.)
            let legacy_start =
                self.history.get(&(t.clone(), id.clone())).is_some_and(|r| r.contains(&(rec.attempts, 0)));
            if rec.state == "running" && (rec.run_ended || (rec.run_started_at.is_none() && !legacy_start)) {
                v.push(format!(
                    "job {}/{}: running without the start of run {} alone",
                    show(t),
                    show(id),
                    rec.attempts
                ));
            }
            if rec.run_ended && rec.run_started_at.is_none() {
                v.push(format!("job {}/{}: a run's end without its start", show(t), show(id)));
            }
            let kept = self.history.get(&(t.clone(), id.clone())).map_or(0, |parts| {
                parts
                    .iter()
                    .filter(|(run, _)| *run != rec.attempts || rec.run_started_at.is_none())
                    .map(|(run, _)| *run)
                    .collect::<BTreeSet<i64>>()
                    .len()
            });
            if kept + usize::from(rec.run_started_at.is_some()) > 10 {
                v.push(format!("job {}/{}: {} runs kept", show(t), show(id), kept + 1));
            }
        }
        for ((t, id), parts) in &self.history {
            if !self.jobs.contains_key(&(t.clone(), id.clone())) {
                v.push(format!("history of {}/{} without a record", show(t), show(id)));
            }
            let runs: BTreeSet<i64> = parts.iter().map(|(run, _)| *run).collect();
            if runs.len() > 10 {
                v.push(format!("history of {}/{}: {} runs", show(t), show(id), runs.len()));
            }
        }
        v
    }

    fn index_violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        let mut per_state: BTreeMap<(Vec<u8>, String), BTreeSet<Vec<u8>>> = BTreeMap::new();
        let mut per_type: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
        for ((t, id), rec) in &self.jobs {
            let Ok(rec) = rec else { continue };
            per_state.entry((t.clone(), rec.state.clone())).or_default().insert(id.clone());
            *per_type.entry(t.clone()).or_default() += 1;
            let who = format!("job {}/{}", show(t), show(id));
            let sched = self.scheduled.get(&(t.clone(), id.clone())).cloned().unwrap_or_default();
            let want: Vec<i64> = if rec.state == "scheduled" { rec.run_at.into_iter().collect() } else { vec![] };
            if sched != want {
                v.push(format!("{who}: {} with scheduled keys {sched:?}, run_at {:?}", rec.state, rec.run_at));
            }
            let exp = self.expiry.get(&(t.clone(), id.clone())).cloned().unwrap_or_default();
            let want: Vec<i64> = if matches!(rec.state.as_str(), "finished" | "canceled" | "failed") {
                rec.expire_at.into_iter().collect()
            } else {
                vec![]
            };
            if exp != want {
                v.push(format!("{who}: {} with expiry keys {exp:?}, expire_at {:?}", rec.state, rec.expire_at));
            }
        }
        for ((t, id), _) in self.scheduled.iter().chain(self.expiry.iter()) {
            if !self.jobs.contains_key(&(t.clone(), id.clone())) {
                v.push(format!("a scheduled or expiry key without a record: {}/{}", show(t), show(id)));
            }
        }
        let mut keys: BTreeSet<(Vec<u8>, String)> = per_state.keys().cloned().collect();
        keys.extend(self.state_counts.keys().cloned());
        keys.extend(self.by_state.keys().cloned());
        let none = BTreeSet::new();
        for key in keys {
            let records = per_state.get(&key).unwrap_or(&none);
            let counter = self.state_counts.get(&key).copied().unwrap_or(0);
            let index = self.by_state.get(&key).unwrap_or(&none);
            if counter != records.len() as i64 {
                v.push(format!("type {} {}: counter {counter}, records {}", show(&key.0), key.1, records.len()));
            }
            if index != records {
                v.push(format!(
                    "type {} {}: index of {} ids, {} records",
                    show(&key.0),
                    key.1,
                    index.len(),
                    records.len()
                ));
            }
        }
        let mut types: BTreeSet<Vec<u8>> = per_type.keys().cloned().collect();
        types.extend(self.type_counts.keys().cloned());
        for t in types {
            let (n, c) = (per_type.get(&t).copied().unwrap_or(0), self.type_counts.get(&t).copied().unwrap_or(0));
            if n != c {
                v.push(format!("type {}: job count {c}, records {n}", show(&t)));
            }
        }
        v
    }

    /// Each group's running counter equals its running records (a
    /// counter left at 0 by runs that ended is fine).
    fn group_violations(&self) -> Vec<String> {
        let mut running: BTreeMap<(Vec<u8>, Vec<u8>), i64> = BTreeMap::new();
        for ((t, _), rec) in &self.jobs {
            if let Ok(Rec { state, group: Some(g), .. }) = rec {
                if state == "running" {
                    *running.entry((t.clone(), g.clone())).or_default() += 1;
                }
            }
        }
        let mut keys: BTreeSet<&(Vec<u8>, Vec<u8>)> = running.keys().collect();
        keys.extend(self.group_running.keys());
        keys.into_iter()
            .filter_map(|k| {
                let (n, c) = (running.get(k).copied().unwrap_or(0), self.group_running.get(k).copied().unwrap_or(0));
                (n != c).then(|| format!("type {} group {}: running counter {c}, records {n}", show(&k.0), show(&k.1)))
            })
            .collect()
    }

    /// Panics with the list of violations, if any.
    pub fn assert_ok(&self, when: &str) {
        let v = self.violations();
        assert!(v.is_empty(), "invariants violated {when}:\n  {}", v.join("\n  "));
    }

    /// Job counts by state, for one type.
    pub fn states(&self, job_type: &[u8]) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for ((t, _), rec) in &self.jobs {
            if t == job_type {
                let state = rec.as_ref().map(|r| r.state.clone()).unwrap_or_else(|_| "undecodable".into());
                *out.entry(state).or_default() += 1;
            }
        }
        out
    }

    pub fn record(&self, job_type: &[u8], id: &[u8]) -> Option<&Rec> {
        self.jobs.get(&(job_type.to_vec(), id.to_vec())).and_then(|r| r.as_ref().ok())
    }

    pub fn members_of(&self, worker_type: &[u8]) -> BTreeSet<Vec<u8>> {
        self.members.get(worker_type).cloned().unwrap_or_default()
    }
}
