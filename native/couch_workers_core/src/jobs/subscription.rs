//! Job subscriptions: one store watch per (node, job), shared by every
//! subscriber of that job on the node.
//!
//! A job watcher reads the record and arms a watch on the job's key in the
//! same transaction, so no change can slip between the read and the
//! watch; when the watch fires it reads again (a watch may fire
//! spuriously, and several changes may coalesce into one firing). Each
//! subscriber remembers the VS it last saw and is told only of a greater
//! one, so it never sees a change twice or out of order. When the record
//! is gone the subscribers get `Removed`, which ends their subscription.
//!
//! A job removed and added again with the same id between two reads is
//! not gone at the second read, and its VS is greater: the record's
//! incarnation (drawn by `add`, kept by every other write) tells it from
//! a later version of the job subscribed to. Each subscriber remembers
//! the incarnation it started from; a read that shows another gives it
//! `Removed`, and ends its subscription, as any removal does (the new
//! job is another one: subscribe to it to follow it). Subscribers of the
//! new job, if any, go on with the same watcher. A record written before
//! incarnations has none, and is taken to be the job subscribed to.
//!
//! `subscribe` reads the job itself (the answer must not wait for the
//! watcher) and then joins the watcher; if the watcher has already seen a
//! newer version, the subscriber gets that one as its current job, and
//! otherwise the watcher's next read catches it up. couch_jobs reads the
//! job in one transaction and starts watching in another, and its
//! notifier compares states, not versions: a change between the two is
//! missed, and a change that comes back to the same state is not seen.
//!
//! Callbacks run under the watcher's lock: after `unsubscribe` returns no
//! callback of that subscription runs. They must not block, and must not
//! subscribe or unsubscribe (that would deadlock): the NIF sends a
//! message.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::job::{Job, JobEvent, JobIncarnation, JobVs};
use super::ops;
use crate::context::Context;
use crate::error::Error;
use crate::log_event;
use crate::store::{run, StoreError, Watch};
use crate::tasks::{sleep_or_cancel, Live};
use crate::tasks::supervise::ServiceKind;
use crate::tasks::watch_limit::is_too_many_watches;

/// Called with each change of a subscribed job; must not block.
pub type OnJobEvent = Box<dyn Fn(JobEvent) + Send + Sync>;

type JobKey = (Vec<u8>, Vec<u8>);

/// The job watchers of a node, by (type, id). Lock order: this map, then a
/// watcher's state.
#[derive(Default)]
pub(crate) struct Watchers {
    map: Mutex<HashMap<JobKey, Arc<JobWatcher>>>,
    next_sub: std::sync::atomic::AtomicU64,
    /// Watcher tasks running (stats).
    pub live: Arc<std::sync::atomic::AtomicUsize>,
}

pub(crate) struct JobWatcher {
    key: JobKey,
    cancel: CancellationToken,
    state: Mutex<WatcherState>,
}

#[derive(Default)]
struct WatcherState {
    /// The job as the watcher last read it.
    last: Option<Job>,
    subscribers: HashMap<u64, Subscriber>,
    /// The reads the watcher has begun: a subscriber that joined before
    /// a read began (`joined` below it) had read the job before that
    /// read's transaction started.
    reads_begun: u64,
}

struct Subscriber {
    seen: JobVs,
    /// Of the job it subscribed to.
    incarnation: Option<JobIncarnation>,
    /// `reads_begun` when it joined.
    joined: u64,
    on_event: OnJobEvent,
}

/// Whether a read of the subscribed id shows another job than the one a
/// subscriber started from: both incarnations known, and different. An
/// unknown one (a record written before format 4) is taken to be the
/// same job: its removal and re-add between two reads would go unseen,
/// as before records carried incarnations.
fn is_another_job(subscribed: Option<JobIncarnation>, read: Option<JobIncarnation>) -> bool {
    matches!((subscribed, read), (Some(a), Some(b)) if a != b)
}

/// A live subscription; dropping it (or [`JobSubscription::cancel`])
/// ends it.
pub struct JobSubscription {
    watchers: Weak<Watchers>,
    watcher: Arc<JobWatcher>,
    id: u64,
}

impl JobSubscription {
    /// Ends the subscription: no callback of it runs after this returns.
    pub fn cancel(&self) {
        if let Some(watchers) = self.watchers.upgrade() {
            watchers.unsubscribe(&self.watcher, self.id);
        } else {
            // The service is gone; its watchers with it.
            self.watcher.lock().subscribers.remove(&self.id);
        }
    }
}

impl Drop for JobSubscription {
    fn drop(&mut self) {
        self.cancel();
    }
}

impl JobWatcher {
    fn lock(&self) -> std::sync::MutexGuard<'_, WatcherState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Watchers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<JobKey, Arc<JobWatcher>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Subscribes to a job read as `current`; returns the job the
    /// subscriber starts from (`current`, or a newer one the watcher has)
    /// and its subscription.
    pub fn subscribe(
        self: &Arc<Self>,
        shared: &Arc<Context>,
        current: Job,
        on_event: OnJobEvent,
    ) -> (Job, JobSubscription) {
        let key = (current.job_type.clone(), current.id.clone());
        let id = self.next_sub.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut map = self.lock();
        let watcher = match map.get(&key) {
            Some(w) => w.clone(),
            None => {
                let watcher = Arc::new(JobWatcher {
                    key: key.clone(),
                    cancel: shared.cancel.child_token(),
                    state: Mutex::new(WatcherState::default()),
                });
                map.insert(key, watcher.clone());
                let (home, w) = (Home { ctx: Arc::downgrade(shared), watchers: Arc::downgrade(self) }, watcher.clone());
                // Failing: logged (a subscriber's only ending is `Removed`,
                // which would be false).
                shared.spawn_supervised(
                    ServiceKind::JobWatcher,
                    watcher.key.0.clone(),
                    watcher.cancel.clone(),
                    None,
                    move || watch_job(home.clone(), w.clone()),
                    None,
                );
                watcher
            }
        };
        let mut state = watcher.lock();
        let start = match &state.last {
            Some(newer) if newer.vs > current.vs => newer.clone(),
            _ => current,
        };
        let joined = state.reads_begun;
        state.subscribers.insert(id, Subscriber { seen: start.vs, incarnation: start.incarnation, joined, on_event });
        drop(state);
        drop(map);
        (start, JobSubscription { watchers: Arc::downgrade(self), watcher, id })
    }

    fn unsubscribe(&self, watcher: &Arc<JobWatcher>, id: u64) {
        let mut map = self.lock();
        let mut state = watcher.lock();
        if state.subscribers.remove(&id).is_some() && state.subscribers.is_empty() {
            if map.get(&watcher.key).is_some_and(|w| Arc::ptr_eq(w, watcher)) {
                map.remove(&watcher.key);
            }
            watcher.cancel.cancel();
        }
    }
}

/// The watcher task of one job; supervised (`tasks/supervise.rs`): a
/// restart reads the job again, and each subscriber's `seen` keeps it from
/// a change twice. Every way it ends for good cancels its token.
async fn watch_job(home: Home, watcher: Arc<JobWatcher>) {
    watch_job_loop(home, &watcher).await;
    // Returned (not a panic, which the supervisor restarts): for good.
    watcher.cancel.cancel();
}

/// What a watcher task holds of its node, weakly: it keeps neither alive.
#[derive(Clone)]
struct Home {
    ctx: Weak<Context>,
    watchers: Weak<Watchers>,
}

async fn watch_job_loop(home: Home, watcher: &Arc<JobWatcher>) {
    let Some(live) = home.watchers.upgrade().map(|w| Live::new(&w.live)) else { return };
    let _live = live;
    let mut failures: u32 = 0;
    // Consecutive watches refused at the handle's limit.
    let mut at_limit: u32 = 0;
    loop {
        let Some(s) = home.ctx.upgrade() else { return };
        let (job_type, id) = (watcher.key.0.as_slice(), watcher.key.1.as_slice());
        let ks = &s.ks;
        // Counted before the read's transaction starts (`reads_begun`).
        let this_read = {
            let mut state = watcher.lock();
            state.reads_begun += 1;
            state.reads_begun
        };
        let read = run(s.db.as_ref(), s.read, |tx| async move {
            let job = ops::get(&tx, ks, job_type, id).await?;
            let watch: Watch = tx.watch(&ks.job(job_type, id));
            Ok((job, watch))
        });
        let outcome = tokio::select! {
            _ = watcher.cancel.cancelled() => return,
            outcome = read => outcome,
        };
        let watch = match outcome {
            Ok((Some(job), watch)) => {
                failures = 0;
                let mut state = watcher.lock();
                let mut ended = false;
                state.subscribers.retain(|_, sub| {
                    if job.vs < sub.seen {
                        // A read from before this subscriber joined (it
                        // saw a later write when it subscribed): nothing
                        // to tell it, and no incarnation to compare.
                        return true;
                    }
                    if is_another_job(sub.incarnation, job.incarnation) {
                        // Its job was removed, and another added with its id.
                        (sub.on_event)(JobEvent::Removed);
                        ended = true;
                        return false;
                    }
                    if job.vs > sub.seen {
                        sub.seen = job.vs;
                        (sub.on_event)(JobEvent::Changed(job.clone()));
                    }
                    true
                });
                state.last = Some(job);
                drop(state);
                if ended && leave_if_unsubscribed(&home, watcher) {
                    return;
                }
                watch
            }
            Ok((None, _watch)) => {
                // Removed: tell every subscriber that joined before this
                // read began (its own read of the job, which found it,
                // ended before this read's transaction started, so the
                // job was removed since). One that joined while the read
                // was in flight may have read a later add: it stays, and
                // the next read tells it. With none left, leave (under
                // the map lock, so a new subscriber starts a new
                // watcher). Not by versions:
                // the embedded store may give a read version above an
                // add's commit version to a read that does not see the
                // add (`store/embedded/transaction/version.rs`).
                failures = 0;
                let watchers = home.watchers.upgrade();
                let mut map = watchers.as_ref().map(|w| w.lock());
                let mut state = watcher.lock();
                state.subscribers.retain(|_, sub| {
                    if sub.joined >= this_read {
                        return true;
                    }
                    (sub.on_event)(JobEvent::Removed);
                    false
                });
                state.last = None;
                if state.subscribers.is_empty() {
                    forget(map.as_deref_mut(), watcher);
                    drop(state);
                    watcher.cancel.cancel();
                    return;
                }
                // Those left joined during this read: read again now (the
                // job they read may have been removed before this read,
                // and then no change would fire the watch).
                continue;
            }
            Err(e) => {
                if matches!(e, StoreError::Closed) || watcher.cancel.is_cancelled() {
                    return;
                }
                failures += 1;
                log_event!(s.log, Warning, "job_watch_read_failed", "type" = job_type, id = id, reason = %e);
                let backoff = Duration::from_millis(50u64 << failures.min(5));
                drop(s);
                if !sleep_or_cancel(backoff, &watcher.cancel).await {
                    return;
                }
                continue;
            }
        };
        let watch_limit = s.watch_limit.clone();
        let log = s.log.clone();
        drop(s);
        let fired = tokio::select! {
            _ = watcher.cancel.cancelled() => return,
            fired = watch => fired,
        };
        let pause = match fired {
            Ok(()) => {
                if at_limit > 0 {
                    at_limit = 0;
                    watch_limit.cleared();
                }
                continue;
            }
            Err(StoreError::Closed) => return,
            Err(e) if is_too_many_watches(&e) => {
                // The handle's limit: every watcher re-reading on a short
                // fixed pause would poll every subscribed job. Back off,
                // growing, and let the node log the episode once.
                at_limit += 1;
                let pause = watch_limit.reached(at_limit);
                let delay_ms = pause.as_millis() as u64;
                log_event!(log, Debug, "job_watch_deferred", "type" = job_type, id = id, delay_ms = delay_ms);
                pause
            }
            // A store hiccup (a recovery's lost watch): read again soon.
            Err(_) => Duration::from_millis(100),
        };
        if !sleep_or_cancel(pause, &watcher.cancel).await {
            return;
        }
    }
}

/// Takes the watcher out of the node's map, if it is still the one there.
fn forget(map: Option<&mut HashMap<JobKey, Arc<JobWatcher>>>, watcher: &Arc<JobWatcher>) {
    if let Some(map) = map.filter(|m| m.get(&watcher.key).is_some_and(|w| Arc::ptr_eq(w, watcher))) {
        map.remove(&watcher.key);
    }
}

/// Ends the watcher if no subscriber is left (all of them were told
/// `Removed`), as the last unsubscribe would: checked under the map lock,
/// so a subscriber that joined meanwhile keeps it, and one that comes
/// after starts a new watcher. Whether it ended.
fn leave_if_unsubscribed(home: &Home, watcher: &Arc<JobWatcher>) -> bool {
    let watchers = home.watchers.upgrade();
    let mut map = watchers.as_ref().map(|w| w.lock());
    let state = watcher.lock();
    if !state.subscribers.is_empty() {
        return false;
    }
    forget(map.as_deref_mut(), watcher);
    drop(state);
    watcher.cancel.cancel();
    true
}

/// Reads the current job for `subscribe`: `not_found` if it does not
/// exist.
pub(crate) async fn read_current(shared: &Context, job_type: &[u8], id: &[u8]) -> Result<Job, Error> {
    ops::check_job_key(&shared.ks, job_type, id)?;
    let ks = &shared.ks;
    run(shared.db.as_ref(), shared.read, |tx| async move { ops::get(&tx, ks, job_type, id).await })
        .await?
        .ok_or(Error::NotFound)
}

#[cfg(test)]
mod tests {
    use super::is_another_job;

    #[test]
    fn another_job_only_when_both_incarnations_are_known_and_differ() {
        assert!(!is_another_job(Some([1; 8]), Some([1; 8])));
        assert!(is_another_job(Some([1; 8]), Some([2; 8])));
        // A record written before incarnations: the same job.
        assert!(!is_another_job(None, Some([2; 8])));
        assert!(!is_another_job(Some([1; 8]), None));
        assert!(!is_another_job(None, None));
    }
}
