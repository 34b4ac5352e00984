//! Counts of live NIF resources, reported by `stats/0` next to the core's
//! task counts, so that leak tests can see handles go as well as tasks.

use std::sync::atomic::{AtomicUsize, Ordering};

/// LiveResource registration resources (`worker_register/4`).
pub static REGISTRATIONS: AtomicUsize = AtomicUsize::new(0);
/// LiveResource membership watch resources (`membership_watch/2`).
pub static WATCHES: AtomicUsize = AtomicUsize::new(0);
/// LiveResource job subscription resources (`job_subscribe/5`).
pub static JOB_SUBSCRIPTIONS: AtomicUsize = AtomicUsize::new(0);
/// LiveResource accept waiter resources (`job_accept/4`): held by callers of
/// `job_accept/2` while they wait.
pub static ACCEPT_WAITERS: AtomicUsize = AtomicUsize::new(0);

/// Counts one live thing while it exists.
pub struct LiveResource(&'static AtomicUsize);

impl LiveResource {
    pub fn new(counter: &'static AtomicUsize) -> LiveResource {
        counter.fetch_add(1, Ordering::SeqCst);
        LiveResource(counter)
    }
}

impl Drop for LiveResource {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

pub fn get(counter: &AtomicUsize) -> usize {
    counter.load(Ordering::SeqCst)
}
