//! One heartbeat task per registered worker.
//!
//! Renews the health record about every third of the timeout (with
//! jitter), so that two heartbeats can be lost before the worker is reaped
//! (the foundationdb-rs leader-election recipe renews at the same ratio).
//! A failed heartbeat is logged and retried sooner; it never gives up
//! while the registration lives. It stops when another incarnation holds
//! the worker's id (`Heartbeat::Gone`): that registration is not ours to
//! renew, and this one was replaced. Both a reinstatement and a
//! replacement are told to the registration's owner (`owner_events`).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::owner_events::{OwnerEvent, OwnerEvents};
use super::{jittered, sleep_or_cancel, wall_clock_s, Live};
use crate::keyspace::{Incarnation, Keyspace};
use crate::log::{Event, Level, Logger};
use crate::store::{run, Db, TxOptions};
use crate::workers::{self, Heartbeat, WorkerSpec};

pub(crate) struct HeartbeatTask {
    pub db: Db,
    pub ks: Keyspace,
    pub spec: Arc<WorkerSpec>,
    pub incarnation: Incarnation,
    pub log: Logger,
    pub cancel: CancellationToken,
    pub tx_options: TxOptions,
    pub events: Arc<OwnerEvents>,
}

/// The renewal period for a timeout: a third of it.
pub fn period(timeout_s: u64) -> Duration {
    Duration::from_millis(timeout_s.saturating_mul(1000) / 3)
}

impl HeartbeatTask {
    pub(crate) async fn run(self, live: Live) {
        let _live = live;
        let period = period(self.spec.timeout_s);
        let mut failures: u32 = 0;
        loop {
            let wait = if failures == 0 { jittered(period, 0.1) } else { jittered(period / 6, 0.5) };
            if !sleep_or_cancel(wait, &self.cancel).await {
                return;
            }
            let spec = self.spec.clone();
            let (ks, inc) = (&self.ks, &self.incarnation);
            let beat = run(self.db.as_ref(), self.tx_options, |tx| {
                let spec = spec.clone();
                async move { workers::heartbeat(&tx, ks, &spec, inc, wall_clock_s()).await }
            });
            let outcome = tokio::select! {
                _ = self.cancel.cancelled() => return,
                outcome = beat => outcome,
            };
            match outcome {
                Ok(Heartbeat::Renewed) => {
                    if failures > 0 {
                        self.log.log(self.event(Level::Notice, "heartbeat_recovered").with("failures", u64::from(failures)));
                    }
                    failures = 0;
                }
                Ok(Heartbeat::Reinstated) => {
                    failures = 0;
                    self.log.log(self.event(Level::Warning, "worker_reinstated"));
                    self.events.emit(OwnerEvent::Reaped);
                }
                Ok(Heartbeat::Gone) => {
                    self.log.log(self.event(Level::Warning, "worker_superseded"));
                    self.events.emit(OwnerEvent::Superseded);
                    return;
                }
                Err(e) => {
                    failures += 1;
                    self.log.log(
                        self.event(Level::Warning, "heartbeat_failed")
                            .with("reason", e.to_string())
                            .with("failures", u64::from(failures)),
                    );
                }
            }
        }
    }

    fn event(&self, level: Level, what: &'static str) -> Event {
        Event::new(level, what).with("type", &self.spec.worker_type).with("id", &self.spec.id)
    }
}
