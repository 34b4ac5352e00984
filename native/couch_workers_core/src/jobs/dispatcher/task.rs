//! A dispatcher's task: its loop over waiters, the type's watch, the timer
//! of the earliest scheduled job and its waiters' deadlines, until no
//! waiter is left or the node stops (the design is `dispatcher`'s module
//! comment). It decides when a round runs (`round.rs`) and sleeps
//! otherwise; it drops waiters that left, answers expired ones, and
//! leaves the registry under its lock.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use super::waiter::{GoneSignal, Waiter};
use super::{Dispatcher, PRUNE_INTERVAL};
use crate::error::Error;
use crate::jobs::place::wall_ms;
use crate::log::TARGET;
use crate::log_event;
use crate::store::{StoreError, Watch};
use crate::tasks::watch_limit::is_too_many_watches;
use crate::tasks::{jittered, sleep_or_cancel, Live};


enum Wake {
    Nothing,
    /// The timer of the earliest scheduled job fired.
    Due,
    Waiter(Waiter),
    Watch(Result<(), StoreError>),
}

/// Waits for the watch if there is one, forever if not.
async fn wait_armed(watch: &mut Option<Watch>) -> Result<(), StoreError> {
    match watch {
        Some(w) => w.await,
        None => std::future::pending().await,
    }
}

/// The monotonic instant at which this node's wall clock reads `at_ms`.
fn instant_of(at_ms: u64) -> Instant {
    let now = Instant::now();
    now.checked_add(Duration::from_millis(at_ms.saturating_sub(wall_ms())))
        .unwrap_or(now + Duration::from_secs(86_400 * 365))
}

impl Dispatcher {
    /// Whether scheduled jobs are due now (and may be taken).
    pub(super) fn due(&self) -> bool {
        !self.paused && self.next_due.is_some_and(|t| t <= wall_ms())
    }

    /// Serves until no waiter is left or the node stops; then it is not
    /// run again. Dropped before that (a panic), it parks its queue.
    pub(super) async fn run(mut self) {
        self.serve().await;
        self.ended = true;
    }

    async fn serve(&mut self) {
        let _live = Live::new(&self.registry.live);
        let mut watch: Option<Watch> = None;
        let mut need_round = true;
        // Whether the next round lets the tasks already woken run first
        // (not after its watch fired: see below).
        let mut yield_first = true;
        let mut failures: u32 = 0;
        // Consecutive watches refused at the handle's limit, and the
        // earliest round that may try to arm one again.
        let mut at_limit: u32 = 0;
        let mut rearm_at: Option<Instant> = None;
        loop {
            if self.cancel.is_cancelled() {
                self.close();
                return;
            }
            while let Ok(w) = self.receiver.try_recv() {
                self.push(w);
                need_round = true;
            }
            self.prune();
            if self.waiters.is_empty() {
                if self.try_exit() {
                    return;
                }
                continue;
            }
            if need_round {
                // Acceptors tend to come together (the members of one
                // group commit get their outcome at once, and each then
                // accepts again): let the tasks already woken run first,
                // so that one round serves them all instead of one each.
                // When its watch fired, the local commit that fired it
                // (`store/embedded/watch.rs`) has just sent its caller's
                // reply (a `job_add`'s), waking an Erlang scheduler that
                // the kernel often queues on this very CPU: give it the
                // CPU first (sched_yield, about 1 µs when nothing else
                // waits for it), or the caller waits behind the whole
                // round (on 2 vCPUs, 130 µs of scheduling delay with the
                // other CPU idle: bench/RESULTS.md, "A local commit fires
                // its watches"). A runtime yield would not: it wakes a
                // second runtime thread to steal this task.
                if std::mem::replace(&mut yield_first, true) {
                    tokio::task::yield_now().await;
                } else {
                    std::thread::yield_now();
                }
                while let Ok(w) = self.receiver.try_recv() {
                    self.push(w);
                }
                let span = tracing::debug_span!(target: TARGET, "accept_round", "type" = self.job_type.as_slice());
                match self.round().instrument(span).await {
                    Ok((more, w)) => {
                        failures = 0;
                        need_round = more;
                        watch = w;
                    }
                    Err(e) => {
                        failures += 1;
                        watch = None;
                        if matches!(e, StoreError::Closed) || self.cancel.is_cancelled() {
                            self.close();
                            return;
                        }
                        let t = self.job_type.as_slice();
                        log_event!(self.shared.log, Warning, "job_accept_round_failed", "type" = t, reason = %e, failures = failures);
                        let pause = jittered(Duration::from_millis(20u64 << failures.min(6)), 0.5);
                        if !sleep_or_cancel(pause, &self.cancel).await {
                            self.close();
                            return;
                        }
                    }
                }
                continue;
            }
            // Waiters and no watch, and not held off at the watch limit:
            // a round arms one. (A waiter taken over in `try_exit` comes
            // here with `need_round` unset; with no timer left to wake the
            // dispatcher it would wait to its deadline.)
            if watch.is_none() && rearm_at.is_none_or(|t| Instant::now() >= t) {
                rearm_at = None;
                need_round = true;
                continue;
            }
            let now = Instant::now();
            let mut wake = self.waiters.iter().map(|w| w.deadline).min().unwrap_or(now);
            if self.waiters.iter().any(|w| !w.signals) {
                wake = wake.min(now + PRUNE_INTERVAL);
            }
            let wake = rearm_at.map_or(wake, |t| wake.min(t));
            let timer = match self.next_due {
                Some(at) if !self.paused => instant_of(at),
                _ => now + Duration::from_secs(86_400),
            };
            let mut armed = watch.take();
            let (woke, why) = tokio::select! {
                _ = self.cancel.cancelled() => (Wake::Nothing, "cancelled"),
                w = self.receiver.recv() => (w.map_or(Wake::Nothing, Wake::Waiter), "waiter"),
                fired = wait_armed(&mut armed) => (Wake::Watch(fired), "watch"),
                // A waiter went away: the loop's prune drops it.
                _ = self.gone.notified() => (Wake::Nothing, "gone"),
                _ = tokio::time::sleep_until(timer) => (Wake::Due, "due"),
                _ = tokio::time::sleep_until(wake) => (Wake::Nothing, "timer"),
            };
            // For tests that count an idle dispatcher's wake-ups (off, and
            // free, unless a subscriber enables it).
            let _ = tracing::debug_span!(target: TARGET, "dispatcher_wake", why = why);
            match woke {
                Wake::Nothing => watch = armed,
                Wake::Due => {
                    watch = armed;
                    need_round = true;
                }
                Wake::Waiter(w) => {
                    watch = armed;
                    self.push(w);
                    need_round = true;
                }
                Wake::Watch(fired) => {
                    crate::stage::mark("dispatcher_woken");
                    need_round = true;
                    yield_first = false;
                    match fired {
                        Ok(()) => {
                            if at_limit > 0 {
                                at_limit = 0;
                                rearm_at = None;
                                self.shared.watch_limit.cleared();
                            }
                        }
                        Err(StoreError::Closed) => {}
                        Err(e) if is_too_many_watches(&e) => {
                            // The handle's limit: rather than a write round
                            // every 50 ms, poll with a growing pause (the
                            // node logs the episode once). Waiters that
                            // arrive are still served at once.
                            at_limit += 1;
                            let pause = self.shared.watch_limit.reached(at_limit);
                            let (t, delay_ms) = (self.job_type.as_slice(), pause.as_millis() as u64);
                            log_event!(
                                self.shared.log,
                                Debug,
                                "accept_watch_deferred",
                                "type" = t,
                                delay_ms = delay_ms
                            );
                            rearm_at = Some(Instant::now() + pause);
                            need_round = false;
                        }
                        Err(_) => {
                            // A failed watch: pause, then a round re-arms it.
                            let _ = sleep_or_cancel(Duration::from_millis(50), &self.cancel).await;
                        }
                    }
                }
            }
            // Waiters but no watch (the last round found none left, then
            // one came back, or the pause at the watch limit is over): a
            // round arms one.
            if watch.is_none() {
                match rearm_at {
                    Some(t) if Instant::now() < t => {}
                    _ => {
                        rearm_at = None;
                        need_round = true;
                    }
                }
            }
        }
    }

    fn push(&mut self, mut w: Waiter) {
        w.signals = w.reply.signal_gone(GoneSignal(self.gone.clone()));
        self.waiters.push_back(w);
    }

    /// Drops waiters that went away and answers expired ones `not_found`.
    fn prune(&mut self) {
        let now = Instant::now();
        let before = self.waiters.len();
        let mut kept = VecDeque::with_capacity(before);
        for w in self.waiters.drain(..) {
            if !w.reply.is_waiting() {
                continue;
            }
            if w.deadline <= now {
                let _ = w.reply.deliver(Err(Error::NotFound));
                continue;
            }
            kept.push_back(w);
        }
        self.registry.waiting.fetch_sub((before - kept.len()) as u64, Ordering::Relaxed);
        self.waiters = kept;
    }

    /// Answers every waiter `store_closed` (the node stops).
    fn close(&mut self) {
        let mut map = self.registry.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.get(&self.job_type).is_some_and(|e| e.id == self.id) {
            map.remove(&self.job_type);
        }
        drop(map);
        self.receiver.close();
        while let Ok(w) = self.receiver.try_recv() {
            self.waiters.push_back(w);
        }
        let n = self.waiters.len() as u64;
        for w in self.waiters.drain(..) {
            let _ = w.reply.deliver(Err(Error::Store(StoreError::Closed)));
        }
        self.registry.waiting.fetch_sub(n, Ordering::Relaxed);
    }

    /// Leaves if no waiter arrived meanwhile (decided under the registry
    /// lock, which every sender holds while sending).
    fn try_exit(&mut self) -> bool {
        let mut map = self.registry.map.lock().unwrap_or_else(|e| e.into_inner());
        match self.receiver.try_recv() {
            Ok(w) => {
                drop(map);
                self.push(w);
                false
            }
            Err(_) => {
                if map.get(&self.job_type).is_some_and(|e| e.id == self.id) {
                    map.remove(&self.job_type);
                }
                true
            }
        }
    }
}
