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

use crate::jobs::ops::type_settings;
use crate::jobs::place::read_counter;
use crate::keyspace::Keyspace;
use crate::store::{StoreError, Tx};

/// The state name of the type's running counter.
pub(super) const RUNNING: &[u8] = b"running";

/// A round's limits: the settings it read and what it took under them.
#[derive(Debug, Default)]
pub(super) struct Limits {
    max_running: Option<u64>,
    /// The type's running jobs as the round read them (under a limit).
    running: u64,
    /// Jobs this round took.
    taken: u64,
    /// A job was passed over, or the queue not read, because of a limit.
    pub held_back: bool,
}

/// Whether a job may be taken now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admit {
    Yes,
    /// The type runs `max_running` jobs: nothing more this round.
    TypeFull,
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
        Ok(Limits { max_running: settings.max_running, running, taken: 0, held_back: false })
    }

    /// The type runs as many jobs as it may (counting this round's):
    /// the round takes nothing more.
    pub fn type_full(&self) -> bool {
        self.max_running.is_some_and(|m| self.running + self.taken >= m)
    }

    /// Whether the next job may be taken; notes a job held back.
    pub fn admit(&mut self) -> Admit {
        if self.type_full() {
            self.held_back = true;
            return Admit::TypeFull;
        }
        Admit::Yes
    }

    /// A job was taken: counted, and the counter it was admitted by gets
    /// a read conflict (a run started elsewhere meanwhile makes this
    /// round retry; one that ended does too, harmlessly).
    pub fn took(&mut self, tx: &Tx, ks: &Keyspace, job_type: &[u8]) {
        if self.max_running.is_some() && self.taken == 0 {
            tx.add_read_conflict_key(&ks.state_count(job_type, RUNNING));
        }
        self.taken += 1;
    }
}
