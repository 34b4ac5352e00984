//! Counts of live NIF resources, reported by `stats/0` next to the core's
//! task counts, so that leak tests can see handles go as well as tasks.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Live registration resources (`worker_register/4`).
pub static REGISTRATIONS: AtomicUsize = AtomicUsize::new(0);
/// Live membership watch resources (`membership_watch/2`).
pub static WATCHES: AtomicUsize = AtomicUsize::new(0);
/// Live job subscription resources (`job_subscribe/5`).
pub static JOB_SUBSCRIPTIONS: AtomicUsize = AtomicUsize::new(0);
/// Live accept waiter resources (`job_accept/4`): held by callers of
/// `job_accept/2` while they wait.
pub static ACCEPT_WAITERS: AtomicUsize = AtomicUsize::new(0);

/// Counts one live thing while it exists.
pub struct Live(&'static AtomicUsize);

impl Live {
    pub fn new(counter: &'static AtomicUsize) -> Live {
        counter.fetch_add(1, Ordering::SeqCst);
        Live(counter)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

pub fn get(counter: &AtomicUsize) -> usize {
    counter.load(Ordering::SeqCst)
}
