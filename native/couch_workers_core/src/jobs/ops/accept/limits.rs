//! The type's running limits as one accept round applies them.
//!
//! A round reads the type's settings (with a conflict: a limit changed
//! while it runs makes it retry). An unlimited type reads nothing more.
//! Under `max_running` it reads the type's running counter
//! (`("counts", JobType, "running")`, moved by `place`/`unplace` in every
//! transaction that starts or ends a run) as a snapshot, and takes at
//! most the room left. The counter gets a read conflict only when the
//! round takes a job: two rounds that take jobs at once then conflict and
//! one retries, while a round that takes nothing (the type is full) does
//! not conflict with the runs that end meanwhile. A run that ends moves
//! the counter, which the waiters' dispatchers watch while they are held
//! back (`round_watch`), so a slot freed anywhere serves a waiter at once.
//!
//! Under `max_running_per_group` the same holds per group, on the
//! group's running counter (`jobs/limits.rs`), read once per group the
//! round meets ([`Limits::load`]) and given a read conflict when the
//! round takes a job of the group. A job of a full group is passed over
//! (it stays queued in its place) and the round takes the next job of a
//! group with room, in queue order. A job without a group is held by
//! `max_running` alone. (The type's running counter moves with every
//! group's runs, so it is the one key the held-back waiters watch.)

use std::collections::HashMap;

use crate::jobs::ops::helpers::get_many;
use crate::jobs::ops::type_settings;
use crate::jobs::place::read_counter;
use crate::keyspace::Keyspace;
use crate::store::{StoreError, Tx, MAX_KEY_SIZE};

/// The state name of the type's running counter.
pub(super) const RUNNING: &[u8] = b"running";

/// A round's limits: the settings it read and what it took under them.
#[derive(Debug, Default)]
pub(super) struct Limits {
    max_running: Option<u64>,
    per_group: Option<u64>,
    /// The type's running jobs as the round read them (under a limit).
    running: u64,
    /// Jobs this round took.
    taken: u64,
    /// Under a per-group limit: each group met, its running jobs as read
    /// and the jobs of it this round took.
    groups: HashMap<Vec<u8>, (u64, u64)>,
    /// A job was passed over, or the queue not read, because of a limit.
    pub held_back: bool,
}

/// Whether a job may be taken now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admit {
    Yes,
    /// The type runs `max_running` jobs: nothing more this round.
    TypeFull,
    /// The job's group runs `max_running_per_group` jobs (or its count
    /// was not read): the job stays queued, later ones may be taken.
    GroupFull,
}

impl Limits {
    /// Reads the type's limits, and its running counter under a
    /// `max_running`.
    pub async fn read(tx: &Tx, ks: &Keyspace, job_type: &[u8]) -> Result<Limits, StoreError> {
        let settings = type_settings(tx, ks, job_type, false).await?;
        let running = match settings.max_running {
            Some(_) => read_counter(tx.get(&ks.state_count(job_type, RUNNING), true).await?),
            None => 0,
        };
        Ok(Limits {
            max_running: settings.max_running,
            per_group: settings.max_running_per_group,
            running,
            taken: 0,
            groups: HashMap::new(),
            held_back: false,
        })
    }

    /// The type has a per-group limit: the round must know the groups'
    /// counts before it offers their jobs.
    pub fn per_group(&self) -> bool {
        self.per_group.is_some()
    }

    /// Whether `group`'s count was read.
    pub fn knows(&self, group: &[u8]) -> bool {
        self.groups.contains_key(group)
    }

    /// Reads the running counters of the `groups` not read yet (as
    /// snapshots, all at once).
    pub async fn load(
        &mut self,
        tx: &Tx,
        ks: &Keyspace,
        job_type: &[u8],
        groups: impl IntoIterator<Item = Vec<u8>>,
    ) -> Result<(), StoreError> {
        let mut wanted: Vec<Vec<u8>> = Vec::new();
        for g in groups {
            if self.knows(&g) || wanted.contains(&g) {
                continue;
            }
            if ks.group_running(job_type, &g).len() > MAX_KEY_SIZE {
                // No run of it can start (the offer fails such a job),
                // and the store refuses to read such a key.
                self.groups.insert(g, (0, 0));
                continue;
            }
            wanted.push(g);
        }
        if wanted.is_empty() {
            return Ok(());
        }
        let keys: Vec<Vec<u8>> = wanted.iter().map(|g| ks.group_running(job_type, g)).collect();
        let counts = get_many(tx, &keys, true).await?;
        for (g, raw) in wanted.into_iter().zip(counts) {
            self.groups.insert(g, (read_counter(raw), 0));
        }
        Ok(())
    }

    /// Whether `group` runs as many jobs as it may (counting this
    /// round's); a group whose count was not read counts as full.
    pub fn group_full(&self, group: &[u8]) -> bool {
        match (self.per_group, self.groups.get(group)) {
            (None, _) => false,
            (Some(max), Some((running, taken))) => running + taken >= max,
            (Some(_), None) => true,
        }
    }

    /// The type runs as many jobs as it may (counting this round's):
    /// the round takes nothing more.
    pub fn type_full(&self) -> bool {
        self.max_running.is_some_and(|m| self.running + self.taken >= m)
    }

    /// Whether the next job (of `group`) may be taken; notes a job held
    /// back.
    pub fn admit(&mut self, group: Option<&[u8]>) -> Admit {
        if self.type_full() {
            self.held_back = true;
            return Admit::TypeFull;
        }
        if group.is_some_and(|g| self.group_full(g)) {
            self.held_back = true;
            return Admit::GroupFull;
        }
        Admit::Yes
    }

    /// A job was taken: counted, and the counter it was admitted by gets
    /// a read conflict (a run started elsewhere meanwhile makes this
    /// round retry; one that ended does too, harmlessly).
    pub fn took(&mut self, tx: &Tx, ks: &Keyspace, job_type: &[u8], group: Option<&[u8]>) {
        if self.max_running.is_some() && self.taken == 0 {
            tx.add_read_conflict_key(&ks.state_count(job_type, RUNNING));
        }
        self.taken += 1;
        if let (Some(_), Some(g)) = (self.per_group, group) {
            if let Some((_, taken)) = self.groups.get_mut(g) {
                if *taken == 0 {
                    tx.add_read_conflict_key(&ks.group_running(job_type, g));
                }
                *taken += 1;
            }
        }
    }
}
