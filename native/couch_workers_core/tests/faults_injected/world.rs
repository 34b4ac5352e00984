//! What the tasks of a scenario share: the callers' model of workers and
//! jobs, the outcomes counted, and the helpers that read it.

use super::*;

/// Whether a job id was created / removed, as far as the callers know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Known {
    #[default]
    No,
    /// The call failed: it may or may not have committed.
    Maybe,
    Yes,
}

#[derive(Debug, Default)]
pub(crate) struct JobModel {
    pub(crate) added: Known,
    pub(crate) removed: Known,
    /// Handles received from accept.
    pub(crate) accepted: u64,
    /// `finish` answered ok.
    pub(crate) finished_ok: u64,
}

/// What the tasks share.
#[derive(Default)]
pub(crate) struct World {
    pub(crate) workers: Vec<(Vec<u8>, Registration)>,
    pub(crate) handles: Vec<JobHandle>,
    pub(crate) jobs: BTreeMap<Vec<u8>, JobModel>,
    pub(crate) watches: Vec<MembershipWatch>,
    pub(crate) subscriptions: Vec<JobSubscription>,
    /// Outcomes by name (`ok`, `not_found`, `retry_limit`, ...).
    pub(crate) outcomes: BTreeMap<String, u64>,
    /// `add`/`add_many` answered `already_exists` for a fresh id: a retry
    /// after a commit-unknown that had committed.
    pub(crate) own_write_already_exists: u64,
    /// Answers no caller should ever see.
    pub(crate) bad: Vec<String>,
    pub(crate) calls: u64,
}

impl World {
    pub(crate) fn note<R>(&mut self, what: &str, r: &Result<R, Error>) {
        self.calls += 1;
        let name = match r {
            Ok(_) => "ok".to_string(),
            Err(e) => e.name().to_string(),
        };
        *self.outcomes.entry(name).or_default() += 1;
        if let Err(e) = r {
            if !acceptable(e) {
                self.bad.push(format!("{what}: {e:?}"));
            }
        }
    }
}

/// The errors a caller may get while the store misbehaves.
pub(crate) fn acceptable(e: &Error) -> bool {
    match e {
        Error::NotFound | Error::AlreadyExists | Error::NotOwner | Error::Canceled => true,
        Error::Store(StoreError::RetryLimit { .. } | StoreError::TimedOut) => true,
        Error::Store(StoreError::Io(msg)) => msg.contains("injected"),
        _ => false,
    }
}

pub(crate) fn spec(id: &[u8]) -> WorkerSpec {
    WorkerSpec {
        worker_type: T.to_vec(),
        id: id.to_vec(),
        options_json: b"{\"o\":1}".to_vec(),
        timeout_s: WORKER_TIMEOUT_S,
    }
}

pub(crate) async fn call<F: std::future::Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(CALL_LIMIT, f).await {
        Ok(out) => out,
        Err(_) => panic!("{what} did not answer within {CALL_LIMIT:?} (a hang)"),
    }
}

pub(crate) fn lock(world: &Mutex<World>) -> std::sync::MutexGuard<'_, World> {
    world.lock().unwrap_or_else(|p| p.into_inner())
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

pub(crate) fn fresh(prefix: &str) -> Vec<u8> {
    format!("{prefix}{}", NEXT_ID.fetch_add(1, Ordering::Relaxed)).into_bytes()
}

pub(crate) fn take_handle(world: &Mutex<World>, rng: &mut StdRng) -> Option<JobHandle> {
    let mut w = lock(world);
    if w.handles.is_empty() {
        return None;
    }
    let i = rng.random_range(0..w.handles.len());
    Some(w.handles.swap_remove(i))
}

pub(crate) fn some_job(world: &Mutex<World>, rng: &mut StdRng) -> Option<Vec<u8>> {
    let w = lock(world);
    if w.jobs.is_empty() {
        return None;
    }
    // Mostly recent jobs (the ones still moving).
    let n = w.jobs.len();
    let i = n - 1 - rng.random_range(0..n.min(40));
    w.jobs.keys().nth(i).cloned()
}

pub(crate) fn live_ids(world: &Mutex<World>) -> BTreeSet<Vec<u8>> {
    lock(world).workers.iter().map(|(id, _)| id.clone()).collect()
}
