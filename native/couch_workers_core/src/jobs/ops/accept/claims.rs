//! The pending jobs a node's takes have in flight, so that two takes of
//! one node do not pick the same job.
//!
//! A node runs many takes of one queue at once: its dispatcher's round
//! and every `job_finish_accept/3` and `job_accept/2` with timeout 0 of
//! its workers, each in its own transaction. All of them read the queue's
//! head; without a word between them they pick the same job, all but one
//! conflict, and most jobs cost their node a wasted transaction (8
//! `finish_accept` workers of one node on FoundationDB: 0.86 conflicts per
//! job without claims, 0.002 with, `tests/jobs_take_contention.rs`, 5 Dec
//! 2026). So a
//! take claims each pending key it is about to take, and the node's other
//! takes offer the keys claimed last: they take the next ones, in queue
//! order, and share the head instead of racing for it.
//!
//! A key a take of the node took stays claimed for [`TAKEN_MEMORY`] after
//! the take ends: a take whose read version predates that commit still
//! sees the key pending, and would otherwise conflict on it. (A take
//! that gave up after an attempt that did not commit leaves its keys so
//! too: the node's other takes then offer those jobs last for that long.)
//!
//! A failed attempt of a take (it will be retried) tells the node that
//! its takes meet others at the head (other nodes', or its own reading a
//! moment late): for [`TAKEN_MEMORY`] its takes then start spread
//! ([`Claimed::contended`], `spread`).
//!
//! A claim is only a preference kept in memory: a take that finds nothing
//! else offers the claimed keys too, so no waiter is ever left without a
//! job that its read shows pending, and the store still decides (two
//! nodes' takes, or a stale read, still conflict, and one retries).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a key taken by one of the node's takes stays claimed after
/// its attempt ended: far longer than a read of the queue takes.
pub const TAKEN_MEMORY: Duration = Duration::from_secs(1);

/// Most taken keys remembered (the oldest are forgotten first).
const TAKEN_MAX: usize = 10_000;

/// The keys claimed by the takes of one node (every type: a pending key
/// names its type).
#[derive(Debug, Default)]
pub struct Claims(Mutex<Held>);

#[derive(Debug, Default)]
struct Held {
    /// Keys claimed by attempts in flight.
    in_flight: HashSet<Vec<u8>>,
    /// Keys claimed by attempts that ended, with when they ended.
    taken: VecDeque<(Instant, Vec<u8>)>,
    taken_set: HashSet<Vec<u8>>,
    /// When an attempt of one of the node's takes of a type last failed
    /// (within [`TAKEN_MEMORY`]), by type.
    failed_at: HashMap<Vec<u8>, Instant>,
}

impl Held {
    fn forget_old(&mut self, now: Instant) {
        while let Some((at, _)) = self.taken.front() {
            if now.duration_since(*at) < TAKEN_MEMORY && self.taken.len() <= TAKEN_MAX {
                break;
            }
            if let Some((_, key)) = self.taken.pop_front() {
                self.taken_set.remove(&key);
            }
        }
    }
}

impl Claims {
    /// A holder for one take of `job_type`'s queue (one call, over all
    /// its attempts).
    pub fn holder(&self, job_type: &[u8]) -> Claimed<'_> {
        Claimed { all: self, job_type: job_type.to_vec(), mine: Mutex::new(Vec::new()), begun: AtomicBool::new(false) }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The claims of one take; dropped, it ends them (`settle`).
#[derive(Debug)]
pub struct Claimed<'c> {
    all: &'c Claims,
    job_type: Vec<u8>,
    mine: Mutex<Vec<Vec<u8>>>,
    /// An attempt of this take has begun.
    begun: AtomicBool,
}

impl Claimed<'_> {
    fn mine(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        self.mine.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Claims `key` for this take: false if another take of the node
    /// holds it or took it a moment ago (this one then offers it last).
    /// Claiming a key this take holds already is true.
    pub fn claim(&self, key: &[u8]) -> bool {
        let mut mine = self.mine();
        if mine.iter().any(|k| k == key) {
            return true;
        }
        let mut held = self.all.held();
        held.forget_old(Instant::now());
        if held.taken_set.contains(key) || !held.in_flight.insert(key.to_vec()) {
            return false;
        }
        mine.push(key.to_vec());
        true
    }

    /// Releases a key this take claimed and then did not take.
    pub fn release(&self, key: &[u8]) {
        let mut mine = self.mine();
        if let Some(i) = mine.iter().position(|k| k == key) {
            mine.swap_remove(i);
            self.all.held().in_flight.remove(key);
        }
    }

    /// A new attempt of this take begins: the last one (if any) ended
    /// without a commit, so the node's takes are contended
    /// ([`Claimed::contended`]), and the keys it claimed are free again
    /// (it lost one of them, or another key it read; the others are
    /// still pending).
    pub fn begin_attempt(&self) {
        if !self.begun.swap(true, Ordering::Relaxed) {
            return;
        }
        let mut mine = self.mine();
        let now = Instant::now();
        let mut held = self.all.held();
        held.failed_at.retain(|_, at| now.duration_since(*at) < TAKEN_MEMORY);
        held.failed_at.insert(self.job_type.clone(), now);
        for key in mine.drain(..) {
            held.in_flight.remove(&key);
        }
    }

    /// Whether an attempt of the node's takes of this queue failed within
    /// the last [`TAKEN_MEMORY`]: other nodes take from its head too.
    pub fn contended(&self) -> bool {
        self.all.held().failed_at.get(&self.job_type).is_some_and(|at| at.elapsed() < TAKEN_MEMORY)
    }

    /// Ends this take (its last attempt committed, or the call gave up):
    /// the keys it took stay claimed for [`TAKEN_MEMORY`].
    fn settle(&self) {
        let mut mine = self.mine();
        if mine.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut held = self.all.held();
        for key in mine.drain(..) {
            held.in_flight.remove(&key);
            if held.taken_set.insert(key.clone()) {
                held.taken.push_back((now, key));
            }
        }
        held.forget_old(now);
    }

    /// How many keys the node's attempts in flight hold, besides this
    /// take's: about how many of the keys at the head of the queue this
    /// take will pass over.
    pub fn others(&self) -> usize {
        let mine = self.mine().len();
        self.all.held().in_flight.len().saturating_sub(mine)
    }
}

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        self.settle();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_held_by_one_take_until_released() {
        let claims = Claims::default();
        let (a, b) = (claims.holder(b"t"), claims.holder(b"t"));
        assert!(a.claim(b"k1"));
        assert!(a.claim(b"k1"), "its own claim again");
        assert!(!b.claim(b"k1"), "held by a");
        assert!(b.claim(b"k2"));
        assert_eq!((a.others(), b.others()), (1, 1));
        a.release(b"k1");
        assert!(b.claim(b"k1"), "released: free at once");
        b.release(b"not claimed");
        assert_eq!(a.others(), 2);
    }

    #[test]
    fn a_failed_attempt_frees_its_keys_and_marks_its_type_contended_for_a_moment() {
        let claims = Claims::default();
        let (a, b, other) = (claims.holder(b"t"), claims.holder(b"t"), claims.holder(b"u"));
        a.begin_attempt();
        assert!(!b.contended(), "a first attempt failed nothing");
        assert!(a.claim(b"k1"));
        a.begin_attempt();
        assert!(b.contended(), "a's first attempt failed");
        assert!(!other.contended(), "another type");
        assert!(b.claim(b"k1"), "a failed attempt's keys are free");
        std::thread::sleep(TAKEN_MEMORY + Duration::from_millis(50));
        assert!(!b.contended());
    }

    #[test]
    fn a_taken_key_stays_claimed_for_a_moment() {
        let claims = Claims::default();
        let b = claims.holder(b"t");
        let a = claims.holder(b"t");
        a.begin_attempt();
        assert!(a.claim(b"k1"));
        drop(a);
        assert_eq!(b.others(), 0, "no attempt in flight holds it");
        assert!(!b.claim(b"k1"), "taken a moment ago");
        std::thread::sleep(TAKEN_MEMORY + Duration::from_millis(50));
        assert!(b.claim(b"k1"), "forgotten after TAKEN_MEMORY");
    }
}
