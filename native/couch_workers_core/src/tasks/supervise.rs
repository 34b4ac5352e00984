//! Supervision of a node's long-lived tasks: the heartbeat service, the
//! reaper, membership watchers, accept dispatchers, job watchers, the
//! job promoter, pruner and sweeper, and the watcher of the counts of
//! calls in callers' transactions.
//!
//! [`Supervisor::supervise`] runs a task made by a factory, catching a
//! panic (`catch_unwind` over `AssertUnwindSafe`: each task keeps what a
//! restart needs in shared structs, which a panic leaves consistent, and
//! rebuilds the rest). When the task panics, or ends while its
//! cancellation token is not cancelled, the end is logged
//! (`service_restarted`: `service`, `type`, `reason`, the panic's message
//! or `ended`, `attempt`, `delay_ms`) and counted
//! ([`crate::metrics::SERVICES`]), and the task is made again after a
//! backoff: [`FIRST_BACKOFF`], doubling to [`MAX_BACKOFF`], jittered, and
//! back to the first once a run lasted [`HEALTHY_RUN`]. A task that ends
//! [`FAILING_RESTARTS`] times within [`FAILING_WINDOW`] is failing: that
//! is logged at error level (`service_failing`), counted, and told to the
//! owners the task serves through its `on_failing` hook (the heartbeat
//! service's tells every registration's owner), once per episode (until a
//! run lasts [`HEALTHY_RUN`]). It is restarted regardless, at the capped
//! backoff, until its token is cancelled.
//!
//! With the `testkit` feature, [`Supervisor::inject_panic`] makes the next
//! run (or the running one, at its next wake-up) of a kind of task panic:
//! never in a release build.

use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{jittered, sleep_or_cancel};
use crate::log::Logger;
use crate::log_event;
use crate::metrics::SERVICES;

/// The first pause before a restart.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// The longest pause before a restart.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// A run this long resets the backoff and ends a failing episode.
pub const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// Restarts within [`FAILING_WINDOW`] that make a task failing.
pub const FAILING_RESTARTS: usize = 5;

/// See [`FAILING_RESTARTS`].
pub const FAILING_WINDOW: Duration = Duration::from_secs(60);

/// The kinds of supervised task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServiceKind {
    Heartbeat,
    Reaper,
    Membership,
    Dispatcher,
    JobWatcher,
    Promoter,
    Pruner,
    Sweeper,
    Leadership,
    Schedules,
    TxCounts,
    Activity,
}

impl ServiceKind {
    #[cfg(feature = "testkit")]
    pub const ALL: [ServiceKind; 12] = [
        ServiceKind::Heartbeat,
        ServiceKind::Reaper,
        ServiceKind::Membership,
        ServiceKind::Dispatcher,
        ServiceKind::JobWatcher,
        ServiceKind::Promoter,
        ServiceKind::Pruner,
        ServiceKind::Sweeper,
        ServiceKind::Leadership,
        ServiceKind::Schedules,
        ServiceKind::TxCounts,
        ServiceKind::Activity,
    ];

    /// The `service` field of the events.
    pub fn name(self) -> &'static str {
        match self {
            ServiceKind::Heartbeat => "heartbeat",
            ServiceKind::Reaper => "reaper",
            ServiceKind::Membership => "membership_watcher",
            ServiceKind::Dispatcher => "job_dispatcher",
            ServiceKind::JobWatcher => "job_watcher",
            ServiceKind::Promoter => "job_promoter",
            ServiceKind::Pruner => "job_pruner",
            ServiceKind::Sweeper => "job_sweeper",
            ServiceKind::Leadership => "leadership_watcher",
            ServiceKind::Schedules => "schedule_runner",
            ServiceKind::TxCounts => "tx_counts_watcher",
            ServiceKind::Activity => "activity_observer",
        }
    }

    #[cfg(feature = "testkit")]
    fn index(self) -> usize {
        self as usize
    }
}

/// Told once per failing episode of a task, on a runtime thread; must not
/// block.
pub(crate) type OnFailing = Box<dyn Fn() + Send + Sync>;

/// One node's supervisor: where its tasks' restarts are logged (and, with
/// `testkit`, the panics a test injects).
pub(crate) struct Supervisor {
    log: Logger,
    #[cfg(feature = "testkit")]
    faults: Faults,
}

impl Supervisor {
    pub(crate) fn new(log: Logger) -> Arc<Supervisor> {
        Arc::new(Supervisor {
            log,
            #[cfg(feature = "testkit")]
            faults: Faults::default(),
        })
    }

    /// The supervised task: runs `factory()`'s future, and makes it again
    /// after each panic or unexpected end (see the module comment), until
    /// `cancel` is cancelled. `label` names the type the task serves
    /// (empty for a node-wide task). The caller spawns it.
    pub(crate) fn supervise<F, Fut>(
        self: &Arc<Self>,
        kind: ServiceKind,
        label: Vec<u8>,
        cancel: CancellationToken,
        factory: F,
        on_failing: Option<OnFailing>,
    ) -> impl Future<Output = ()> + Send + 'static
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let sup = self.clone();
        async move {
            let mut backoff = FIRST_BACKOFF;
            let mut ends: VecDeque<Instant> = VecDeque::new();
            let mut attempt: u64 = 0;
            let mut reported = false;
            loop {
                if cancel.is_cancelled() {
                    return;
                }
                let started = Instant::now();
                let outcome = AssertUnwindSafe(sup.run(kind, factory())).catch_unwind().await;
                if cancel.is_cancelled() {
                    return;
                }
                let reason = match outcome {
                    Ok(()) => "ended".to_string(),
                    Err(payload) => panic_message(payload.as_ref()),
                };
                let now = Instant::now();
                if now.duration_since(started) >= HEALTHY_RUN {
                    backoff = FIRST_BACKOFF;
                    ends.clear();
                    reported = false;
                }
                attempt += 1;
                ends.push_back(now);
                while ends.front().is_some_and(|t| now.duration_since(*t) > FAILING_WINDOW) {
                    ends.pop_front();
                }
                let delay = jittered(backoff, 0.2);
                SERVICES.restarted.fetch_add(1, Ordering::Relaxed);
                let (service, t) = (kind.name(), label.as_slice());
                let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
                log_event!(
                    sup.log,
                    Warning,
                    "service_restarted",
                    service = service,
                    "type" = t,
                    reason = reason.as_str(),
                    attempt = attempt,
                    delay_ms = delay_ms
                );
                if ends.len() >= FAILING_RESTARTS && !reported {
                    reported = true;
                    SERVICES.failing.fetch_add(1, Ordering::Relaxed);
                    let restarts = ends.len();
                    let window_s = FAILING_WINDOW.as_secs();
                    log_event!(
                        sup.log,
                        Error,
                        "service_failing",
                        service = service,
                        "type" = t,
                        reason = reason.as_str(),
                        restarts = restarts,
                        window_s = window_s
                    );
                    if let Some(hook) = &on_failing {
                        hook();
                    }
                }
                if !sleep_or_cancel(delay, &cancel).await {
                    return;
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }

    #[cfg(not(feature = "testkit"))]
    async fn run<Fut: Future<Output = ()>>(&self, _kind: ServiceKind, task: Fut) {
        task.await
    }

    /// The task, or the panic a test injected into it.
    #[cfg(feature = "testkit")]
    async fn run<Fut: Future<Output = ()>>(&self, kind: ServiceKind, task: Fut) {
        tokio::select! {
            biased;
            () = self.faults.fired(kind) => panic!("injected panic in {}", kind.name()),
            () = task => {}
        }
    }

    /// Makes the next `times` runs of a task of `kind` on this node panic
    /// (a running one at once, while it waits): one run each, whichever
    /// task of the kind takes it first.
    #[cfg(feature = "testkit")]
    pub(crate) fn inject_panic(&self, kind: ServiceKind, times: u32) {
        self.faults.pending[kind.index()].fetch_add(times, Ordering::SeqCst);
        self.faults.notify[kind.index()].notify_waiters();
    }
}

/// The panics a test asked for, per kind.
#[cfg(feature = "testkit")]
struct Faults {
    pending: [std::sync::atomic::AtomicU32; ServiceKind::ALL.len()],
    notify: [tokio::sync::Notify; ServiceKind::ALL.len()],
}

#[cfg(feature = "testkit")]
impl Default for Faults {
    fn default() -> Self {
        Faults {
            pending: std::array::from_fn(|_| std::sync::atomic::AtomicU32::new(0)),
            notify: std::array::from_fn(|_| tokio::sync::Notify::new()),
        }
    }
}

#[cfg(feature = "testkit")]
impl Faults {
    /// Resolves once this task takes one of the kind's pending panics.
    async fn fired(&self, kind: ServiceKind) {
        let (pending, notify) = (&self.pending[kind.index()], &self.notify[kind.index()]);
        loop {
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if pending.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
                return;
            }
            notified.await;
        }
    }
}

/// The message of a panic's payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".to_string()
    }
}
