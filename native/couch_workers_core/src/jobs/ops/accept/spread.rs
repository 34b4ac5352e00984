//! Where a take starts in the queue when takes meet at its head.
//!
//! Every taker reads the queue's head, so two takers that run at once
//! pick the same job and one of them conflicts. If the loser's retry read
//! the head again it would meet the takers that come fresh to the head
//! meanwhile (the other workers of a busy queue come back at once), and it
//! could lose every race until its budget ended (on FoundationDB:
//! `job_finish_accept/3` answered `timeout`, a node's round failed and its
//! waiters got `not_found` while jobs were pending).
//!
//! So an attempt after a failed one starts at a random one of the first
//! [`window`] pending jobs of the head's priority, skipping the head
//! itself, and the jobs it passed over come after the rest of that
//! priority. The window grows with each failed attempt, so that however
//! many takers there are, the loser soon picks a job nobody else does.
//! While a node's takes keep meeting others (an attempt of the node failed
//! within the last second, `Claimed::contended`), their first attempts
//! start so too, with the first window: takes of several nodes then
//! rarely pick the same job (4 nodes on FoundationDB,
//! `tests/jobs_take_contention.rs`, measured while choosing it on 5 Dec
//! 2026: 0.68 conflicts per job with the spread on retries only, 0.42
//! with a first window of 8 per waiter, 0.16 with 32).
//!
//! What it costs in order: an uncontended take takes in exact queue
//! order; a spread one may take a job before at most `window − 1` older
//! jobs of the same priority that are still pending (they are left for
//! the next takers): 31 for a lone taker, 32 per waiter for a round, more
//! after further conflicts, never more than 1,023; and never a job before
//! one of a lower priority number. couch_jobs, for comparison, takes a
//! random one of the first 1,024 on every accept.

use std::collections::VecDeque;

use rand::Rng;

/// The window of a round's first retry, per waiter it serves: about the
/// number of takers it can dodge at once.
pub const FIRST_WINDOW: usize = 32;

/// The largest window (couch_jobs' constant).
pub const MAX_WINDOW: usize = 1_024;

/// How many pending jobs past the head an attempt may start at, after
/// `retries` failed attempts of its round, for `waiters` waiters: 0 on
/// the first attempt (exact order), then [`FIRST_WINDOW`] per waiter,
/// doubling with each retry, at most [`MAX_WINDOW`].
pub fn window(waiters: usize, retries: u32) -> usize {
    if retries == 0 {
        return 0;
    }
    let growth = 1usize << (retries - 1).min(16);
    FIRST_WINDOW.saturating_mul(waiters.max(1)).saturating_mul(growth).min(MAX_WINDOW)
}

/// The order in which a round offers the keys it read (queue order):
/// unchanged for `window` 0; else starting at a random position in
/// `1..=window` among the leading keys of the head's priority (`priority`
/// of each key; `None` for a key that is not a pending key, which ends
/// the run), then the rest of that run, then the keys passed over, then
/// every later key in order. A run of one key (or none) is not spread.
pub fn order<K>(keys: Vec<K>, window: usize, priority: impl Fn(&K) -> Option<i64>) -> VecDeque<K> {
    let start = match keys.first().map(&priority) {
        Some(Some(head)) if window > 0 => {
            let run = keys.iter().take(window + 1).take_while(|k| priority(k) == Some(head)).count();
            if run > 1 {
                rand::rng().random_range(1..run)
            } else {
                0
            }
        }
        _ => 0,
    };
    rotated(keys, start, &priority)
}

/// `keys` with the first `start` keys moved behind the rest of the head's
/// priority run.
fn rotated<K>(keys: Vec<K>, start: usize, priority: &impl Fn(&K) -> Option<i64>) -> VecDeque<K> {
    if start == 0 {
        return keys.into();
    }
    let head = keys.first().and_then(priority);
    let run = keys.iter().take_while(|k| priority(k) == head).count();
    let mut keys: VecDeque<K> = keys.into();
    keys.make_contiguous()[..run].rotate_left(start);
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_attempt_keeps_queue_order() {
        assert_eq!(window(1, 0), 0);
        assert_eq!(window(100, 0), 0);
        let keys = vec![(0, 'a'), (0, 'b'), (0, 'c')];
        assert_eq!(order(keys.clone(), 0, |k| Some(k.0)), VecDeque::from(keys));
    }

    #[test]
    fn the_window_grows_with_retries_and_waiters_up_to_its_cap() {
        assert_eq!(window(1, 1), 32);
        assert_eq!(window(1, 2), 64);
        assert_eq!(window(4, 1), 128);
        assert_eq!(window(4, 3), 512);
        assert_eq!(window(1, 6), 1_024);
        assert_eq!(window(1, 40), MAX_WINDOW);
        assert_eq!(window(30, 1), 960);
        assert_eq!(window(100, 1), MAX_WINDOW);
        assert_eq!(window(usize::MAX, 1), MAX_WINDOW);
    }

    #[test]
    fn a_retry_skips_the_head_and_stays_within_the_window_and_the_heads_priority() {
        // 5 jobs of priority 0, then 3 of priority 1.
        let keys: Vec<(i64, usize)> = (0..8).map(|i| (if i < 5 { 0 } else { 1 }, i)).collect();
        let mut starts = std::collections::HashSet::new();
        for _ in 0..500 {
            let got: Vec<(i64, usize)> = order(keys.clone(), 3, |k| Some(k.0)).into();
            let start = got[0].1;
            assert!((1..=3).contains(&start), "{got:?}");
            starts.insert(start);
            // Every job of the head's priority before any later one, each
            // once; the jobs passed over right behind the rest of the run.
            let expect: Vec<usize> = (start..5).chain(0..start).chain(5..8).collect();
            assert_eq!(got.iter().map(|k| k.1).collect::<Vec<_>>(), expect);
        }
        assert_eq!(starts.len(), 3, "every start in the window is drawn: {starts:?}");
    }

    #[test]
    fn a_run_shorter_than_the_window_bounds_the_start() {
        let keys = vec![(0, 0), (0, 1), (7, 2), (7, 3)];
        for _ in 0..100 {
            let got: Vec<usize> = order(keys.clone(), 64, |k| Some(k.0)).into_iter().map(|k| k.1).collect();
            assert_eq!(got, vec![1, 0, 2, 3], "never a job of priority 7 before one of priority 0");
        }
        let lone = vec![(0, 0), (1, 1)];
        assert_eq!(order(lone, 64, |k| Some(k.0)).into_iter().map(|k| k.1).collect::<Vec<_>>(), vec![0, 1]);
        let garbage_head: Vec<(Option<i64>, usize)> = vec![(None, 0), (Some(0), 1), (Some(0), 2)];
        let got: Vec<usize> = order(garbage_head, 8, |k| k.0).into_iter().map(|k| k.1).collect();
        assert_eq!(got, vec![0, 1, 2], "a key that is not a pending key is not spread");
    }
}
