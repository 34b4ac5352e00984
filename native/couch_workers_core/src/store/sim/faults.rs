//! The sim store's injectable faults and latencies, drawn from one seeded
//! generator so that a run is reproducible from its seed (as long as the
//! test drives the store in a deterministic order, e.g. from one task on a
//! current-thread runtime).

use std::collections::VecDeque;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A latency drawn uniformly from `[min, max]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Latency {
    pub min: Duration,
    pub max: Duration,
}

impl Latency {
    pub const ZERO: Latency = Latency { min: Duration::ZERO, max: Duration::ZERO };

    pub fn between(min: Duration, max: Duration) -> Self {
        Latency { min, max: max.max(min) }
    }

    pub fn fixed(d: Duration) -> Self {
        Latency { min: d, max: d }
    }
}

/// What goes wrong, and how often. Probabilities are per transaction
/// (commit faults) or per commit batch (recoveries, spurious watch fires).
#[derive(Debug, Clone, PartialEq)]
pub struct SimFaults {
    /// A commit answers `commit_unknown_result` (1021); half of those did
    /// commit, half did not.
    pub commit_unknown: f64,
    /// A commit batch is lost to a recovery: its transactions answer
    /// `commit_unknown_result` (not committed), every watch errors, and
    /// versions jump by 100 s' worth.
    pub recovery: f64,
    /// A commit batch fires one armed watch whose value did not change (FDB
    /// watches may fire spuriously).
    pub spurious_watch: f64,
    /// Getting a read version.
    pub grv_latency: Latency,
    /// Each read.
    pub read_latency: Latency,
    /// A commit batch: the proxy gathers the commits that arrive during it
    /// into one batch, which commits at one version.
    pub commit_latency: Latency,
}

impl SimFaults {
    /// No faults, no latency: FDB's semantics only.
    pub fn none() -> Self {
        SimFaults {
            commit_unknown: 0.0,
            recovery: 0.0,
            spurious_watch: 0.0,
            grv_latency: Latency::ZERO,
            read_latency: Latency::ZERO,
            commit_latency: Latency::ZERO,
        }
    }

    /// Latencies of a healthy cluster in one data centre (GRV and reads
    /// ~0.3-1 ms, commits ~2 ms), no faults.
    pub fn fdb_like_latencies() -> Self {
        SimFaults {
            grv_latency: Latency::between(Duration::from_micros(300), Duration::from_micros(1_000)),
            read_latency: Latency::between(Duration::from_micros(200), Duration::from_micros(800)),
            commit_latency: Latency::between(Duration::from_micros(1_500), Duration::from_micros(2_500)),
            ..SimFaults::none()
        }
    }
}

impl Default for SimFaults {
    fn default() -> Self {
        SimFaults::none()
    }
}

/// A fault chosen for one commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitFault {
    /// The commit happens; the client is told `commit_unknown_result`.
    UnknownCommitted,
    /// The commit does not happen; the client is told `commit_unknown_result`.
    UnknownNotCommitted,
}

/// The seeded source of every random choice of one cluster.
#[derive(Debug)]
pub(super) struct Dice {
    rng: StdRng,
    faults: SimFaults,
    /// Faults a test asked for, used by the next commits in order.
    scripted: VecDeque<CommitFault>,
}

fn draw(rng: &mut StdRng, latency: Latency) -> Duration {
    if latency.max <= latency.min {
        return latency.min;
    }
    let span = (latency.max - latency.min).as_nanos() as u64;
    latency.min + Duration::from_nanos(rng.random_range(0..=span))
}

impl Dice {
    pub(super) fn new(seed: u64, faults: SimFaults) -> Self {
        Dice { rng: StdRng::seed_from_u64(seed), faults, scripted: VecDeque::new() }
    }

    pub(super) fn set_faults(&mut self, faults: SimFaults) {
        self.faults = faults;
    }

    pub(super) fn script(&mut self, fault: CommitFault) {
        self.scripted.push_back(fault);
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.random_bool(p.min(1.0))
    }

    pub(super) fn commit_fault(&mut self) -> Option<CommitFault> {
        if let Some(fault) = self.scripted.pop_front() {
            return Some(fault);
        }
        if !self.chance(self.faults.commit_unknown) {
            return None;
        }
        Some(if self.rng.random_bool(0.5) { CommitFault::UnknownCommitted } else { CommitFault::UnknownNotCommitted })
    }

    pub(super) fn recovery(&mut self) -> bool {
        self.chance(self.faults.recovery)
    }

    /// Which of `n` armed watches fires spuriously, if one does.
    pub(super) fn spurious_watch(&mut self, n: usize) -> Option<usize> {
        if n == 0 || !self.chance(self.faults.spurious_watch) {
            return None;
        }
        Some(self.rng.random_range(0..n))
    }

    pub(super) fn grv_latency(&mut self) -> Duration {
        draw(&mut self.rng, self.faults.grv_latency)
    }

    pub(super) fn read_latency(&mut self) -> Duration {
        draw(&mut self.rng, self.faults.read_latency)
    }

    pub(super) fn commit_latency(&mut self) -> Duration {
        draw(&mut self.rng, self.faults.commit_latency)
    }

    /// `on_error`'s backoff: up to FoundationDB's first retry delay (10 ms).
    pub(super) fn backoff(&mut self) -> Duration {
        Duration::from_micros(self.rng.random_range(0..10_000))
    }
}
