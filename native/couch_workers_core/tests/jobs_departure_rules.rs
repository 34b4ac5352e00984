//! A departure's leftover running jobs follow the rule of the
//! registration that ran them, whatever happens to the worker id before
//! the sweeper gets to them: an unregister releases its jobs (queued
//! again, an attempt given back), a death fails them (`worker_lost`, an
//! attempt spent). A worker that leaves with more running jobs than one
//! transaction may move leaves the rest to the sweeper; if the id is
//! registered again and that registration leaves the other way before the
//! sweep, the first registration's jobs must still go its way.
//!
//! Raw transactions on the store (no node, so no sweeper runs before the
//! test calls the sweep), on the embedded and the sim store and on a live
//! FoundationDB. Every job
//! may run once (`max_attempts` 1): a released one is pending again, a
//! lost one ends failed.

use couch_workers_core::jobs::{ops, Departure, JobOpts, JobSpec, JobState, MaxAttempts};
use couch_workers_core::keyspace::{Incarnation, Keyspace};
use couch_workers_core::roster;
use couch_workers_core::store::{run, Db, TxOptions};
use couch_workers_core::test_store::{StoreKind, TestStore};
use couch_workers_core::workers::WorkerSpec;

const T: &[u8] = b"t";
const W: &[u8] = b"w";
/// More than two transactions' share ([`ops::REQUEUE_MAX_JOBS`]): the
/// first registration's removal leaves jobs to the sweeper, and so does
/// the second's.
const FIRST: usize = 2 * ops::REQUEUE_MAX_JOBS + 100;
/// Jobs the second registration runs itself.
const SECOND: usize = 2;

fn spec() -> WorkerSpec {
    WorkerSpec { worker_type: T.to_vec(), id: W.to_vec(), options_json: b"{}".to_vec(), timeout_s: 3600 }
}

/// One attempt; the second registration's own jobs come first in the
/// queue (a lower priority), before the first's released ones.
fn once(priority: i64) -> JobOpts {
    JobOpts { max_attempts: Some(MaxAttempts::Limit(1)), priority: Some(priority), ..JobOpts::default() }
}

struct Store {
    db: Db,
    ks: Keyspace,
}

impl Store {
    fn new(db: Db) -> Store {
        let ks = Keyspace::new(&db.prefix());
        Store { db, ks }
    }

    async fn register(&self, incarnation: &Incarnation) {
        let (ks, sp) = (&self.ks, &spec());
        run(self.db.as_ref(), TxOptions::write(), |tx| async move {
            roster::register_replacing(&tx, ks, sp, incarnation, 0).await
        })
        .await
        .expect("register");
    }

    /// Adds `n` jobs named `<prefix><i>` and accepts them all for `W`.
    async fn run_jobs(&self, prefix: &str, n: usize, priority: i64) {
        let ks = &self.ks;
        let specs: Vec<JobSpec> = (0..n)
            .map(|i| JobSpec { id: format!("{prefix}{i:05}").into_bytes(), info: b"{}".to_vec(), opts: once(priority) })
            .collect();
        let s = &specs;
        run(self.db.as_ref(), TxOptions::write(), |tx| async move {
            ops::add_many_jobs(&tx, ks, T, s, couch_workers_core::jobs::wall_ms()).await
        })
        .await
        .expect("add_many")
        .expect("added");
        let waiters = vec![W.to_vec(); n];
        let tokens = ops::new_tokens(n);
        let (w, t) = (&waiters, &tokens);
        let round = run(self.db.as_ref(), TxOptions::write(), |tx| async move {
            let acceptors =
                ops::Acceptors { workers: w, incarnations: &[], tokens: t, recheck: false, retries: 0, claims: None };
            ops::accept(&tx, ks, T, acceptors).await
        })
        .await
        .expect("accept");
        let taken = round.takes.iter().filter(|t| matches!(t, ops::Take::Job(_))).count();
        assert_eq!(taken, n, "every job running for {}", String::from_utf8_lossy(W));
        for t in &round.takes {
            if let ops::Take::Job(h) = t {
                assert!(h.job.id.starts_with(prefix.as_bytes()), "took one of its own jobs");
            }
        }
    }

    /// Ends `incarnation`'s registration: an unregister or a death.
    async fn leave(&self, incarnation: &Incarnation, departure: Departure) {
        let ks = &self.ks;
        let removed = run(self.db.as_ref(), TxOptions::write(), |tx| async move {
            match departure {
                Departure::Released => roster::remove(&tx, ks, T, W, incarnation).await,
                Departure::Lost => roster::remove_dead(&tx, ks, T, W, incarnation).await.map(|n| n.is_some()),
            }
        })
        .await
        .expect("remove");
        assert!(removed, "{departure:?}: removed");
    }

    /// What the sweeper does: the orphan marker worked off to its end.
    async fn sweep(&self) {
        let ks = &self.ks;
        let mut cursor = None;
        loop {
            let c = cursor.as_ref();
            let step =
                run(
                    self.db.as_ref(),
                    TxOptions::write(),
                    |tx| async move { ops::sweep_orphan(&tx, ks, T, W, c).await },
                )
                .await
                .expect("sweep");
            match step {
                ops::SweepStep::Done { .. } => return,
                ops::SweepStep::More { cursor: next, .. } => cursor = Some(next),
            }
        }
    }

    async fn state(&self, id: &str) -> JobState {
        let ks = &self.ks;
        run(self.db.as_ref(), TxOptions::read(), |tx| async move { ops::get(&tx, ks, T, id.as_bytes()).await })
            .await
            .expect("get")
            .expect("the job")
            .state
    }

    /// `(pending, running, failed)` counts of the type.
    async fn counts(&self) -> (u64, u64, u64) {
        let ks = &self.ks;
        let c = run(self.db.as_ref(), TxOptions::read(), |tx| async move { ops::counts(&tx, ks, T).await })
            .await
            .expect("counts");
        let at = |s: JobState| c[JobState::ALL.iter().position(|x| *x == s).unwrap()];
        (at(JobState::Pending), at(JobState::Running), at(JobState::Failed))
    }
}

/// The first registration leaves as `first`, the second (which runs jobs
/// of its own) as `second`, both before any sweep; then the sweep.
async fn leftovers_follow_their_registration(db: Db, first: Departure, second: Departure) {
    let s = Store::new(db);
    let (a, b): (Incarnation, Incarnation) = ([1; 16], [2; 16]);
    s.register(&a).await;
    s.run_jobs("a", FIRST, 0).await;
    s.leave(&a, first).await;
    s.register(&b).await;
    s.run_jobs("b", SECOND, -1).await;
    s.leave(&b, second).await;
    s.sweep().await;
    let (pending, running, failed) = s.counts().await;
    let ended = |d: Departure, n: usize| match d {
        Departure::Released => (n as u64, 0),
        Departure::Lost => (0, n as u64),
    };
    let (p1, f1) = ended(first, FIRST);
    let (p2, f2) = ended(second, SECOND);
    assert_eq!(running, 0, "every job left the worker");
    assert_eq!(
        (pending, failed),
        (p1 + p2, f1 + f2),
        "(pending, failed): the first registration's {FIRST} jobs {first:?}, the second's {SECOND} {second:?}"
    );
    // The last of the first registration's jobs (left to the sweeper).
    let want = |d: Departure| if d == Departure::Released { JobState::Pending } else { JobState::Failed };
    assert_eq!(s.state(&format!("a{:05}", FIRST - 1)).await, want(first));
    assert_eq!(s.state("b00000").await, want(second));
}

async fn an_unregisters_leftovers_are_released_after_the_next_registration_dies(kind: StoreKind) {
    let store = TestStore::with_seed(kind, 21);
    leftovers_follow_their_registration(store.db(), Departure::Released, Departure::Lost).await;
}

async fn a_deaths_leftovers_fail_after_the_next_registration_unregisters(kind: StoreKind) {
    let store = TestStore::with_seed(kind, 22);
    leftovers_follow_their_registration(store.db(), Departure::Lost, Departure::Released).await;
}

couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread", worker_threads = 2),
    stores: [embedded: Embedded, sim: Sim],
    tests: [
        an_unregisters_leftovers_are_released_after_the_next_registration_dies,
        a_deaths_leftovers_fail_after_the_next_registration_unregisters,
    ],
);
