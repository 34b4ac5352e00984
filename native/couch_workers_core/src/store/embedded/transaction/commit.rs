//! The commit of an embedded transaction: the watches armed with the
//! values it saw, the commit version fixed, and the SQLite commit done
//! alone or left to the group commit (`group.rs`).


use super::{release, EmbeddedTransaction, Slot, TxState};
use crate::store::embedded::group;
use crate::store::embedded::schema;
use crate::store::embedded::watch::{KeyChange, WatchSender};
use crate::store::mutation as ops;
use crate::store::{CommitInfo, StoreError};

impl EmbeddedTransaction {
    /// [`Transaction::commit`](crate::store::Transaction::commit).
    pub(super) async fn commit_all(&self) -> Result<CommitInfo, StoreError> {
        self.flush_adds(|_| true);
        if self.shared.group.worth_waiting(tasks_waiting()) && self.lock().writer_with_writes() {
            // About to commit alone while this process's writers come
            // together, or while tasks wait for a runtime thread: let the
            // tasks already ready run first. Those that write queue for the
            // lock, and this commit becomes a group commit that they join
            // (bench/RESULTS.md: J2 with commits 7dd4ee4 and a069011, and
            // with commit 4185965, 1 Dec 2026).
            tokio::task::yield_now().await;
        }
        let mut armed = Vec::new();
        let mut spared = Vec::new();
        let mut changed = Vec::new();
        let written;
        let (info, deferred) = {
            let mut st = self.lock();
            // A read refused as unreadable fails the commit, as on FDB.
            let refused = st.unreadable.refused().then(StoreError::accessed_unreadable);
            if let Err(e) = refused.map_or_else(|| self.usable(&mut st), Err) {
                self.fail(&mut st, e.clone());
                st.finished = true;
                return Err(e);
            }
            let result = self.commit_locked(&mut st, &mut armed, &mut spared, &mut changed);
            st.finished = true;
            written = std::mem::take(&mut st.written);
            match result {
                Ok((info, deferred)) => {
                    if deferred.is_some() {
                        // The work stays in the batch: let the next writer
                        // in without rolling anything back.
                        st.slot = Slot::Released;
                    } else {
                        release(&self.shared, &mut st);
                    }
                    (info, deferred)
                }
                Err(e) => {
                    self.fail(&mut st, e.clone());
                    for (_, _, tx) in armed {
                        let _ = tx.send(Err(e.clone()));
                    }
                    return Err(e);
                }
            }
        };
        let member = deferred.is_some();
        if let Some((seq, outcome)) = deferred {
            if let Err(e) = group::wait(&self.shared, seq, outcome).await {
                self.lock().error = Some(e.clone());
                for (_, _, tx) in armed {
                    let _ = tx.send(Err(e.clone()));
                }
                return Err(e);
            }
        }
        // A member's batch told the hub itself (`group::OnCommit`).
        if info.version.is_some() && !member {
            self.shared.watches.notify_commit(&written, &spared, &changed);
        }
        for (key, value, tx) in armed {
            self.shared.watches.register(key, value, tx);
        }
        Ok(info)
    }
}

/// Whether tasks wait in the runtime's shared queue: where a task spawned
/// or woken from outside the runtime (a NIF call's request, an accept
/// that wakes the dispatcher) waits until a runtime thread is free. Under
/// load the next writer is often there while this one commits (measured
/// through the API: bench/RESULTS.md, J2 with commit 4185965).
fn tasks_waiting() -> bool {
    tokio::runtime::Handle::try_current().is_ok_and(|h| h.metrics().global_queue_depth() > 0)
}

/// A watch to arm: key, the value the transaction saw, its sender.
type Armed = (Vec<u8>, Option<Vec<u8>>, WatchSender);

impl EmbeddedTransaction {
    /// Reads the watched values, fixes the version, commits. The watches
    /// go to `armed`, also on failure (the caller fails them); the spared
    /// keys with their values before and after this transaction to
    /// `spared`, and the watched keys it wrote (`first_writes`) to
    /// `changed`.
    /// A writer that leaves its commit to the group (`group.rs`) gets the
    /// batch to wait for.
    fn commit_locked(
        &self,
        st: &mut TxState,
        armed: &mut Vec<Armed>,
        spared: &mut Vec<KeyChange>,
        changed: &mut Vec<KeyChange>,
    ) -> Result<(CommitInfo, Option<(u64, group::Outcome)>), StoreError> {
        let watches = std::mem::take(&mut st.watches);
        let spared_keys = std::mem::take(&mut st.spared);
        let first_writes = std::mem::take(&mut st.first_writes);
        let TxState { slot, wrote, commit, nested, written, .. } = st;
        let writer = matches!(slot, Slot::Writer(_));
        let conn = match slot.conn() {
            Ok(conn) => conn,
            Err(e) => {
                armed.extend(watches.into_iter().map(|(k, tx)| (k, None, tx)));
                return Err(e);
            }
        };
        // The values the watches were set on: this transaction's view.
        let mut failure = None;
        for (key, tx) in watches {
            let value = if failure.is_some() {
                None
            } else {
                schema::get_value(conn, &key).unwrap_or_else(|e| {
                    failure = Some(schema::store_error("cannot read a watched key", &e));
                    None
                })
            };
            armed.push((key, value, tx));
        }
        if let Some(err) = failure {
            return Err(err);
        }
        let value_now = |key: &[u8]| {
            schema::get_value(conn, key).map_err(|e| schema::store_error("cannot read a written watched key", &e))
        };
        for (key, before) in spared_keys {
            let after = value_now(&key)?;
            spared.push(KeyChange { key, before, after });
        }
        for (key, before) in first_writes {
            let after = value_now(&key)?;
            changed.push(KeyChange { key, before, after });
        }
        let info = if *wrote {
            let version = self.version(conn, commit)?;
            CommitInfo { version: Some(version), versionstamp: commit.stamped.then(|| ops::versionstamp(version)) }
        } else {
            CommitInfo::default()
        };
        if !writer {
            schema::exec_cached(conn, "COMMIT").map_err(|e| schema::store_error("cannot commit", &e))?;
            if *wrote {
                // A read connection has no WAL hook (the write connection's
                // sends the wake-ups): its commit wakes the other handles
                // here, now that it is visible, or they would see it only
                // at their safety look.
                self.shared.peers.wake_all();
            }
            return Ok((info, None));
        }
        if *nested {
            self.shared.group.keep_joined(conn)?;
            // Its work now belongs to the batch: a failure from here on
            // must not roll back to a savepoint that is gone.
            *nested = false;
        }
        if self.shared.group.should_defer() {
            // Whoever commits the batch tells the watch hub of this
            // member's writes, once it committed: this member may stop
            // waiting for it (its future dropped) and never would.
            let on_commit = info.version.is_some().then(|| {
                let (hub, written, spared, changed) = (
                    self.shared.watches.clone(),
                    std::mem::take(written),
                    std::mem::take(spared),
                    std::mem::take(changed),
                );
                Box::new(move || hub.notify_commit(&written, &spared, &changed)) as group::OnCommit
            });
            return Ok((info, Some(self.shared.group.join(on_commit))));
        }
        group::commit_batch(&self.shared.group, conn)?;
        Ok((info, None))
    }
}
