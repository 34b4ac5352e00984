//! One accept round: a transaction that takes up to one job per waiter
//! for the first [`ROUND_MAX_WAITERS`] waiters, then the deliveries, the
//! move of due jobs no waiter took, and the watch armed for the waiters
//! left. Apart from the dispatcher's loop (`task.rs`) because it is the
//! part that talks to the store: the loop only decides when it runs.

use std::sync::atomic::Ordering;

use super::give_back::{log_unrunnable, reclaim, release};
use super::{Dispatcher, ROUND_MAX_WAITERS};
use crate::error::Error;
use crate::jobs::commit::complete_handle_vs;
use crate::jobs::ops::{self, Take};
use crate::jobs::promoter::promote;
use crate::keyspace::Incarnation;
use crate::store::{run, run_attempts, StoreError, Watch};

impl Dispatcher {
    /// One accept round for the first waiters. Returns whether another
    /// round is due at once, and the watch armed for the waiters left.
    pub(super) async fn round(&mut self) -> Result<(bool, Option<Watch>), StoreError> {
        let n = self.waiters.len().min(ROUND_MAX_WAITERS);
        self.in_round = self.waiters.drain(..n).collect();
        let workers: Vec<Vec<u8>> = self.in_round.iter().map(|w| w.worker.clone()).collect();
        let incarnations: Vec<Option<Incarnation>> = self.in_round.iter().map(|w| w.incarnation).collect();
        let rest = self.waiters.len();
        let tokens = ops::new_tokens(workers.len());
        self.round_tokens = workers.iter().cloned().zip(tokens.iter().copied()).collect();
        let shared = &self.shared;
        let ks = &shared.ks;
        let job_type = &self.job_type;
        let mut attempts = 0u32;
        let claimed = self.registry.claims.holder(job_type);
        let outcome = run_attempts(shared.db.as_ref(), shared.write, |tx, _| {
            attempts += 1;
            let acceptors = ops::Acceptors::attempt(&workers, &incarnations, &tokens, attempts, &claimed);
            async move {
                let round = ops::accept(&tx, ks, job_type, acceptors).await?;
                let left = rest > 0 || round.takes.iter().any(|t| matches!(t, Take::NoJob));
                let seen =
                    if left { Some(ops::round_version(&tx, ks, job_type, round.held_back).await?) } else { None };
                Ok((round, seen))
            }
        })
        .await;
        drop(claimed);
        crate::stage::mark("round_committed");
        self.round_tokens.clear();
        let batch = std::mem::take(&mut self.in_round);
        let ((round, seen), info) = match outcome {
            Ok(done) => done,
            Err(e) => {
                // An attempt may have committed (`commit_unknown`, or cut
                // off in its commit): what it took under these tokens goes
                // back to pending. The batch waits on, in front, and the
                // next round draws new tokens.
                if !matches!(e, StoreError::Closed) {
                    reclaim(shared, job_type.clone(), workers.into_iter().zip(tokens).collect());
                }
                for w in batch.into_iter().rev() {
                    self.waiters.push_front(w);
                }
                return Err(e);
            }
        };
        // A batch with no waiter left over may have stopped short of the
        // pending jobs only because it was full: the waiters behind it are
        // due a round now, since no watch fires for jobs already pending.
        let batch_drained = !round.takes.iter().any(|t| matches!(t, Take::NoJob));
        let held_back = round.held_back;
        log_unrunnable(&self.shared, job_type, &round.unrunnable);
        self.next_due = round.next_due;
        self.paused = round.paused;
        let again = round.more || (rest > 0 && batch_drained);
        let mut left = Vec::new();
        let mut answered = 0u64;
        for (waiter, take) in batch.into_iter().zip(round.takes) {
            match take {
                Take::NoJob => left.push(waiter),
                Take::NotRegistered => {
                    answered += 1;
                    let _ = waiter.reply.deliver(Err(Error::NotFound));
                }
                Take::Job(mut handle) => {
                    answered += 1;
                    match complete_handle_vs(&mut handle, &info) {
                        Ok(()) => {}
                        Err(e) => {
                            // Cannot happen (the round wrote versionstamped
                            // values); give the job back rather than hand
                            // out a handle without a valid vs.
                            let _ = waiter.reply.deliver(Err(Error::Store(e)));
                            release(&self.shared, handle).await;
                            continue;
                        }
                    }
                    let fallback = handle.clone();
                    if !waiter.reply.deliver(Ok(handle)) {
                        release(&self.shared, fallback).await;
                    }
                }
            }
        }
        self.registry.waiting.fetch_sub(answered, Ordering::Relaxed);
        for w in left.into_iter().rev() {
            self.waiters.push_front(w);
        }
        if self.due() {
            // After the deliveries: jobs that fell due and that no waiter
            // took (more than the waiters, or stale keys) move to pending,
            // so that counts and later accepts find them there, and the
            // timer is re-armed for what is left.
            self.next_due = promote(&self.shared, &self.job_type).await?;
        }
        let Some(seen) = seen else { return Ok((again, None)) };
        // The watch for the waiters left, armed now in a read-only
        // transaction (not in the round's: see `ops::pending_watch`). A
        // job that became pending since the round's read either moved
        // `jobs_vs` before this read (then it differs from what the round
        // saw: another round at once) or fires the watch.
        // Under a running limit that held jobs back, the type's running
        // counter is watched too: a run that ends on any node frees a slot.
        let (now, watch) = run(shared.db.as_ref(), shared.read, |tx| async move {
            ops::round_watch(&tx, ks, job_type, held_back).await
        })
        .await?;
        if now != seen {
            return Ok((true, None));
        }
        Ok((again, Some(watch)))
    }
}
