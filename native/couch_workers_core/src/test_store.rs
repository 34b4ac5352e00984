//! Which store a test runs on (feature `testkit`, for tests only): one
//! test body, run on the embedded store, the `sim` store or a live
//! FoundationDB cluster, never copied per store.
//!
//! * [`StoreKind`]: the store a test asks for.
//! * [`TestStore`]: a fresh, isolated store of that kind (a temporary
//!   directory, a new simulated cluster, a new FDB directory
//!   `("couch_workers_test", <pid>-<random>)`), from which [`TestStore::db`]
//!   opens a new handle per "node" (as each Erlang node opens its own);
//!   removed when dropped.
//! * [`store_tests!`](crate::store_tests): the tests of a file, each an
//!   `async fn(StoreKind)`, expanded into one `#[tokio::test]` per store.
//!   The FoundationDB ones are compiled only with the cargo feature `fdb`
//!   and are `#[ignore]`d, so that a plain `cargo test` reports them as
//!   ignored, never as passed; `scripts/live-cargo-test.sh` (which passes
//!   `--include-ignored`) runs them under `scripts/fdb-cluster.sh run`.
//!
//! Run without `FDB_CLUSTER_FILE`, an FDB test fails with a loud
//! `SKIPPED:` line: no FoundationDB test passes without a cluster.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::store::embedded::{EmbeddedOptions, EmbeddedStore};
use crate::store::sim::{SimOptions, SimStore};
use crate::store::Db;

/// The store a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    /// The embedded (SQLite) store in a temporary directory.
    Embedded,
    /// The in-memory FoundationDB simulation, without faults or latencies.
    Sim,
    /// A live FoundationDB cluster (`FDB_CLUSTER_FILE`; cargo feature `fdb`).
    Fdb,
}

impl StoreKind {
    /// As [`crate::store::Database::kind`] names it.
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Embedded => "embedded",
            StoreKind::Sim => "sim",
            StoreKind::Fdb => "fdb",
        }
    }
}

const SKIP: &str = "SKIPPED: FoundationDB tests need FDB_CLUSTER_FILE (the cluster file of a test cluster) \
                    and libfdb_c; NONE of them ran. See docs/fdb.md (scripts/fdb-cluster.sh run -- \
                    scripts/live-cargo-test.sh ...).";

/// The directory every FDB test directory lives under.
pub const FDB_TEST_ROOT: &str = "couch_workers_test";

/// The cluster file of the test cluster, if `FDB_CLUSTER_FILE` names one.
pub fn fdb_cluster_file() -> Option<PathBuf> {
    std::env::var_os("FDB_CLUSTER_FILE").filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// Prints the loud line that says no FoundationDB test ran.
pub fn fdb_loud_skip() {
    let bar = "!".repeat(100);
    eprintln!("\n{bar}\n{SKIP}\n{bar}\n");
}

/// The cluster file, or the loud skip line and a panic.
pub fn fdb_require_cluster() -> PathBuf {
    match fdb_cluster_file() {
        Some(path) => path,
        None => {
            fdb_loud_skip();
            panic!("{SKIP}");
        }
    }
}

/// Runs `f` to completion on a plain thread. FDB's futures are driven by
/// its network thread, not by a runtime, so this may be called from
/// synchronous code inside a test's runtime (any flavour) and from `drop`.
#[cfg(feature = "fdb")]
fn block_on_thread<T: Send + 'static>(
    f: impl std::future::Future<Output = T> + Send + 'static,
) -> std::thread::Result<T> {
    std::thread::spawn(move || futures::executor::block_on(f)).join()
}

/// An FDB test directory `(FDB_TEST_ROOT, <pid>-<random>)`; removed (with
/// everything in it) when dropped. The `couchdb` directory is never
/// touched.
#[cfg(feature = "fdb")]
pub struct FdbTestDir {
    cluster_file: PathBuf,
    name: String,
}

#[cfg(feature = "fdb")]
impl FdbTestDir {
    pub fn new(cluster_file: PathBuf) -> Self {
        FdbTestDir { cluster_file, name: format!("{}-{:016x}", std::process::id(), rand::random::<u64>()) }
    }

    pub fn path(&self) -> [&str; 2] {
        [FDB_TEST_ROOT, &self.name]
    }

    pub fn cluster_file(&self) -> &Path {
        &self.cluster_file
    }

    /// A new handle on the directory (its own connections and watches;
    /// the process's one network thread).
    pub async fn open(&self) -> Arc<crate::store::fdb::FdbStore> {
        crate::store::fdb::FdbStore::open_at(&self.cluster_file, &self.path())
            .await
            .unwrap_or_else(|e| panic!("opening FDB test directory {:?}: {e}", self.path()))
    }

    /// The same from synchronous code.
    pub fn open_blocking(&self) -> Arc<crate::store::fdb::FdbStore> {
        let (cluster_file, name) = (self.cluster_file.clone(), self.name.clone());
        let opened = block_on_thread(async move {
            crate::store::fdb::FdbStore::open_at(&cluster_file, &[FDB_TEST_ROOT, name.as_str()]).await
        });
        match opened {
            Ok(Ok(store)) => store,
            Ok(Err(e)) => panic!("opening FDB test directory {:?}: {e}", self.path()),
            Err(_) => panic!("opening FDB test directory {:?}: panic", self.path()),
        }
    }
}

#[cfg(feature = "fdb")]
impl Drop for FdbTestDir {
    fn drop(&mut self) {
        // Through a fresh handle (the test may have closed its own).
        let (cluster_file, name) = (self.cluster_file.clone(), self.name.clone());
        let removed = block_on_thread(async move {
            let store = crate::store::fdb::FdbStore::open_at(&cluster_file, &[FDB_TEST_ROOT, name.as_str()]).await?;
            store.remove_directory().await
        });
        match removed {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => eprintln!("WARNING: FDB test directory ({FDB_TEST_ROOT}, {}) not removed: {e}", self.name),
            Err(_) => eprintln!("WARNING: FDB test directory ({FDB_TEST_ROOT}, {}) not removed: panic", self.name),
        }
    }
}

enum Backing {
    Embedded(tempfile::TempDir),
    Sim(Arc<SimStore>),
    #[cfg(feature = "fdb")]
    Fdb(FdbTestDir),
}

/// A fresh, isolated store of one kind, removed when dropped (drop it
/// after every handle's last use).
pub struct TestStore {
    kind: StoreKind,
    backing: Backing,
}

impl TestStore {
    /// A fresh store. `Sim` gets a random seed (see [`TestStore::sim`]);
    /// `Fdb` needs `FDB_CLUSTER_FILE` (else the loud skip line and a
    /// panic) and the cargo feature `fdb` (else a panic).
    pub fn new(kind: StoreKind) -> TestStore {
        match kind {
            StoreKind::Embedded => {
                TestStore { kind, backing: Backing::Embedded(tempfile::tempdir().expect("temp dir")) }
            }
            StoreKind::Sim => TestStore::sim(SimOptions::new(rand::random())),
            #[cfg(feature = "fdb")]
            StoreKind::Fdb => TestStore { kind, backing: Backing::Fdb(FdbTestDir::new(fdb_require_cluster())) },
            #[cfg(not(feature = "fdb"))]
            StoreKind::Fdb => {
                let _ = fdb_require_cluster();
                panic!("a FoundationDB test store needs the cargo feature `fdb`")
            }
        }
    }

    /// A fresh store; a `Sim` one from `seed` (a test that pins its
    /// simulation), the others as [`TestStore::new`].
    pub fn with_seed(kind: StoreKind, seed: u64) -> TestStore {
        match kind {
            StoreKind::Sim => TestStore::sim(SimOptions::new(seed)),
            other => TestStore::new(other),
        }
    }

    /// A fresh simulated cluster with these options (a seed, faults).
    pub fn sim(opts: SimOptions) -> TestStore {
        TestStore { kind: StoreKind::Sim, backing: Backing::Sim(SimStore::new(opts)) }
    }

    pub fn kind(&self) -> StoreKind {
        self.kind
    }

    /// A new handle on the store: a new embedded store on the directory, a
    /// new connection to the simulated cluster, a new FDB database handle
    /// on the directory. Each "node" of a test opens its own.
    pub fn db(&self) -> Db {
        match &self.backing {
            Backing::Embedded(dir) => EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open store"),
            Backing::Sim(sim) => sim.connect(),
            #[cfg(feature = "fdb")]
            Backing::Fdb(dir) => dir.open_blocking(),
        }
    }

    /// The embedded store's directory.
    pub fn embedded_dir(&self) -> Option<&Path> {
        match &self.backing {
            Backing::Embedded(dir) => Some(dir.path()),
            _ => None,
        }
    }

    /// A new embedded store handle on the directory (`None` on another
    /// kind): for what only that store counts (its watches).
    pub fn embedded(&self) -> Option<Arc<EmbeddedStore>> {
        self.embedded_dir().map(|dir| EmbeddedStore::open(EmbeddedOptions::new(dir)).expect("open store"))
    }

    /// The simulated cluster (`None` on another kind): its counters.
    pub fn sim_cluster(&self) -> Option<&Arc<SimStore>> {
        match &self.backing {
            Backing::Sim(sim) => Some(sim),
            _ => None,
        }
    }
}

/// The tests of a file on several stores, each test an `async fn` taking
/// the [`StoreKind`](crate::test_store::StoreKind) to open:
///
/// ```text
/// async fn jobs_survive(store: StoreKind) { let c = Cluster::on(store); ... }
///
/// couch_workers_core::store_tests!(
///     runtime: (flavor = "multi_thread"),
///     stores: [embedded: Embedded],
///     tests: [jobs_survive, ...],
/// );
/// ```
///
/// expands, for each store listed, into a module named as given (here
/// `embedded`) with one `#[tokio::test(<runtime>)]` per test calling it
/// with that kind; and, with the cargo feature `fdb`, into a module `fdb`
/// of the same tests on [`StoreKind::Fdb`](crate::test_store::StoreKind),
/// each `#[ignore]`d (run them with `--include-ignored` and a cluster, as
/// `scripts/live-cargo-test.sh` does). The test crate needs `tokio` with
/// `macros` and `rt-multi-thread`.
#[macro_export]
macro_rules! store_tests {
    (
        runtime: $rt:tt,
        stores: [$($module:ident : $kind:ident),* $(,)?],
        tests: $tests:tt $(,)?
    ) => {
        $(
            $crate::__cw_store_tests_module!($module, $kind, $rt, (), $tests);
        )*

        #[cfg(feature = "fdb")]
        $crate::__cw_store_tests_module!(
            fdb,
            Fdb,
            $rt,
            (#[ignore = "needs a FoundationDB cluster: scripts/fdb-cluster.sh run -- scripts/live-cargo-test.sh --features fdb --test ..."]),
            $tests
        );
    };
}

/// One module of [`store_tests!`]: each test on one store kind.
#[doc(hidden)]
#[macro_export]
macro_rules! __cw_store_tests_module {
    ($module:ident, $kind:ident, $rt:tt, $attr:tt, [$($name:ident),+ $(,)?]) => {
        mod $module {
            $(
                $crate::__cw_store_test!($kind, $rt, $attr, $name);
            )+
        }
    };
}

/// One test of [`store_tests!`], with an extra attribute or none.
#[doc(hidden)]
#[macro_export]
macro_rules! __cw_store_test {
    ($kind:ident, $rt:tt, (), $name:ident) => {
        #[::tokio::test $rt]
        async fn $name() {
            super::$name($crate::test_store::StoreKind::$kind).await;
        }
    };
    ($kind:ident, $rt:tt, (#[$attr:meta]), $name:ident) => {
        #[::tokio::test $rt]
        #[$attr]
        async fn $name() {
            super::$name($crate::test_store::StoreKind::$kind).await;
        }
    };
}
