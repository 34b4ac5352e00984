//! The reaper: every node runs one; it removes workers whose heartbeats
//! stopped.
//!
//! A scan walks the health records of every worker type in small read
//! transactions (skipping from type to type, so member options are never
//! read), compares each with the store's read version (the liveness rule
//! in `liveness.rs`), and reaps each dead worker in its own transaction
//! that re-checks the record. Reapers on several nodes may race: the
//! re-check under serializable transactions means a worker is removed
//! once, and never while a heartbeat renewed it.
//!
//! Between scans it sleeps until the earliest worker could expire (so a
//! dead worker goes within milliseconds of its timeout), bounded by
//! `max_interval` (so new workers are picked up) and jittered.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{jittered, sleep_or_cancel, Live};
use crate::keyspace::{Keyspace, WorkerKey};
use crate::liveness::{self, VERSIONS_PER_SECOND};
use crate::log::{Event, Level, Logger};
use crate::store::{run, Db, RangeRequest, StoreError, TxOptions};
use crate::workers;

/// Health records read per scan transaction.
const SCAN_BATCH: usize = 1000;

pub(crate) struct Reaper {
    pub db: Db,
    pub ks: Keyspace,
    pub log: Logger,
    pub cancel: CancellationToken,
    pub max_interval: Duration,
    pub tx_options: TxOptions,
}

/// A worker that looked dead in a scan.
struct Suspect {
    worker_type: Vec<u8>,
    id: Vec<u8>,
}

struct Scan {
    suspects: Vec<Suspect>,
    /// Versions until the earliest live worker could expire.
    next_expiry: Option<u64>,
}

impl Reaper {
    pub(crate) async fn run(self, live: Live) {
        let _live = live;
        loop {
            let wait = match self.scan_and_reap().await {
                Ok(Some(versions)) => {
                    // Wake just after the earliest expiry (plus 20 ms so the
                    // store's clock has surely passed it).
                    let until = Duration::from_micros(versions.saturating_mul(1_000_000 / VERSIONS_PER_SECOND));
                    (until + Duration::from_millis(20)).min(jittered(self.max_interval, 0.2))
                }
                Ok(None) => jittered(self.max_interval, 0.2),
                Err(e) => {
                    if self.cancel.is_cancelled() {
                        return;
                    }
                    self.log.log(Event::new(Level::Warning, "reaper_scan_failed").with("reason", e.to_string()));
                    jittered(self.max_interval, 0.2)
                }
            };
            if !sleep_or_cancel(wait, &self.cancel).await {
                return;
            }
        }
    }

    /// One pass; returns the versions until the next possible expiry.
    async fn scan_and_reap(&self) -> Result<Option<u64>, StoreError> {
        let scan = self.scan().await?;
        for suspect in scan.suspects {
            if self.cancel.is_cancelled() {
                break;
            }
            let ks = &self.ks;
            let s = &suspect;
            let reaped = run(self.db.as_ref(), self.tx_options, |tx| async move {
                workers::reap_if_dead(&tx, ks, &s.worker_type, &s.id).await
            })
            .await;
            match reaped {
                Ok(true) => self.log.log(
                    Event::new(Level::Notice, "worker_reaped").with("type", &suspect.worker_type).with("id", &suspect.id),
                ),
                Ok(false) => {}
                Err(e) => self.log.log(
                    Event::new(Level::Warning, "reap_failed")
                        .with("type", &suspect.worker_type)
                        .with("id", &suspect.id)
                        .with("reason", e.to_string()),
                ),
            }
        }
        Ok(scan.next_expiry)
    }

    async fn scan(&self) -> Result<Scan, StoreError> {
        let mut scan = Scan { suspects: Vec::new(), next_expiry: None };
        let (_, all_end) = self.ks.all_workers_range();
        let (mut cursor, _) = self.ks.all_workers_range();
        let read = TxOptions { writes: false, ..self.tx_options };
        loop {
            // The next worker type at or after the cursor.
            let ks = &self.ks;
            let (begin, end) = (cursor.clone(), all_end.clone());
            let first = run(self.db.as_ref(), read, |tx| {
                let r = RangeRequest::new(begin.clone(), end.clone()).limit(1).snapshot(true);
                async move { tx.get_range(&r).await }
            })
            .await?;
            let Some((key, _)) = first.into_iter().next() else { break };
            let worker_type = match ks.parse_worker_key(&key) {
                Some(WorkerKey::Vs { worker_type })
                | Some(WorkerKey::Member { worker_type, .. })
                | Some(WorkerKey::Health { worker_type, .. })
                | Some(WorkerKey::Log { worker_type, .. })
                | Some(WorkerKey::LogFloor { worker_type }) => worker_type,
                None => {
                    // A key of no known shape: step over it.
                    cursor = key;
                    cursor.push(0);
                    continue;
                }
            };
            self.scan_type(&worker_type, read, &mut scan).await?;
            // Skip past every key of this type.
            cursor = ks.worker_type_range(&worker_type).1;
        }
        Ok(scan)
    }

    async fn scan_type(&self, worker_type: &[u8], read: TxOptions, scan: &mut Scan) -> Result<(), StoreError> {
        let (mut begin, end) = self.ks.health_range(worker_type);
        loop {
            let ks = &self.ks;
            let (b, e) = (begin.clone(), end.clone());
            let (rows, read_version) = run(self.db.as_ref(), read, |tx| {
                let r = RangeRequest::new(b.clone(), e.clone()).limit(SCAN_BATCH).snapshot(true);
                async move {
                    let rows = tx.get_range(&r).await?;
                    Ok((rows, tx.read_version().await?))
                }
            })
            .await?;
            let full = rows.len() == SCAN_BATCH;
            for (key, value) in &rows {
                let Some(WorkerKey::Health { worker, .. }) = ks.parse_worker_key(key) else { continue };
                match Keyspace::parse_health(value) {
                    Some(h) if !liveness::is_dead(&h, read_version) => {
                        let left = liveness::versions_until_dead(&h, read_version);
                        scan.next_expiry = Some(scan.next_expiry.map_or(left, |n| n.min(left)));
                    }
                    _ => scan.suspects.push(Suspect { worker_type: worker_type.to_vec(), id: worker }),
                }
            }
            match rows.last() {
                Some((last, _)) if full => {
                    begin = last.clone();
                    begin.push(0);
                }
                _ => return Ok(()),
            }
        }
    }
}
