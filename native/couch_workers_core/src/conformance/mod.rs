//! The store conformance suite: one set of behaviours, run against every
//! store (the embedded and `sim` stores always; FoundationDB when
//! `FDB_CLUSTER_FILE` is set), so that key-space code written against
//! [`crate::store`] means the same thing everywhere.
//!
//! Test code: compiled only with the crate's `testkit` feature, which the
//! crate's own tests turn on (its dev-dependency on itself) and nothing
//! shipped does (`scripts/check-no-testkit.sh` checks the built NIF).
//!
//! # How a store plugs in
//!
//! A store under test provides two async functions:
//!
//! ```text
//! /// A fresh, empty, isolated store. `guard` keeps whatever backs it alive
//! /// (a temp dir; an FDB test directory, removed on drop).
//! async fn open_fresh() -> TestDb;
//! /// A second, independent handle on the SAME store as `first` (its own
//! /// connections, threads and watches: as another Erlang node would
//! /// open it). Its `guard` may be `Box::new(())`: `first` outlives it.
//! async fn open_second(first: &TestDb) -> TestDb;
//! ```
//!
//! and expands the suite into one `#[tokio::test(flavor = "multi_thread")]`
//! per behaviour:
//!
//! ```text
//! couch_workers_core::store_conformance_tests!(open_fresh, open_second);
//! // or, with attributes put on every generated test:
//! couch_workers_core::store_conformance_tests!(open_fresh, open_second, attrs: #[ignore = "needs FDB"]);
//! ```
//!
//! The generated tests need `tokio` (with `macros` and `rt-multi-thread`)
//! among the test crate's dependencies. A store that is not always there
//! (FoundationDB) should not make its tests pass without asserting
//! anything: put them behind `attrs: #[ignore = "..."]` and run them with
//! `-- --ignored` where the store exists (and/or gate the file on a cargo
//! feature), so that a machine without it shows them as ignored, not
//! passed.
//!
//! `open_second` finds the store of `first` through `first.guard` (downcast
//! it to the guard type your `open_fresh` put there) or through
//! `first.db.prefix()`.
//!
//! Rules the suite keeps, and the store must allow:
//!
//! * every key it touches starts with `db.prefix()` (FDB: the test
//!   directory's prefix), followed by `b"cwconf/"`; a fresh store may be
//!   assumed empty under it;
//! * [`close_fails_pending_watches`] calls `close()` on a handle from
//!   `open_second` and then keeps using the first handle: `close` must end
//!   only its own handle;
//! * every test takes well under 3 s on an idle machine (one waits for an
//!   idle FoundationDB's empty commit batch, up to 2 s).
//!
//! Each behaviour is a `pub async fn(&dyn StoreFactory)`, callable on its
//! own. A test that asserts nothing is never counted as passed: each one
//! checks an outcome.

use std::any::Any;

pub use futures::future::BoxFuture;

use crate::store::Db;

/// A store handle under test.
pub struct TestDb {
    pub db: Db,
    /// Keeps the store's backing alive while the test runs (a temp dir; an
    /// FDB test directory that is removed on drop).
    pub guard: Box<dyn Any + Send + Sync>,
}

/// How the suite opens stores. [`store_conformance_tests!`] implements it
/// from two async functions; implement it by hand for anything fancier.
pub trait StoreFactory: Send + Sync {
    /// A fresh, empty, isolated store.
    fn fresh(&self) -> BoxFuture<'_, TestDb>;
    /// A second independent handle on the same store as `first`.
    fn second<'a>(&'a self, first: &'a TestDb) -> BoxFuture<'a, TestDb>;
}

/// One `#[tokio::test]` per behaviour name, each calling
/// `$crate::$module::$name(&$store)` with the caller's attributes. Shared
/// by this suite's macro and `keyspace_conformance_tests!`.
#[doc(hidden)]
#[macro_export]
macro_rules! __cw_conformance_cases {
    ($module:ident, $store:ident, [$($attrs:tt)*]) => {};
    ($module:ident, $store:ident, [$($attrs:tt)*] $name:ident $(, $rest:ident)* $(,)?) => {
        $($attrs)*
        #[::tokio::test(flavor = "multi_thread")]
        async fn $name() {
            $crate::$module::$name(&$store).await;
        }
        $crate::__cw_conformance_cases!($module, $store, [$($attrs)*] $($rest),*);
    };
}

/// A [`StoreFactory`] named `$store` from the two opening functions.
#[doc(hidden)]
#[macro_export]
macro_rules! __cw_conformance_store {
    ($store:ident, $open_fresh:expr, $open_second:expr) => {
        struct $store;

        impl $crate::conformance::StoreFactory for $store {
            fn fresh(&self) -> $crate::conformance::BoxFuture<'_, $crate::conformance::TestDb> {
                ::std::boxed::Box::pin(($open_fresh)())
            }
            fn second<'a>(
                &'a self,
                first: &'a $crate::conformance::TestDb,
            ) -> $crate::conformance::BoxFuture<'a, $crate::conformance::TestDb> {
                ::std::boxed::Box::pin(($open_second)(first))
            }
        }
    };
}

/// Expands the conformance suite into one tokio test per behaviour. See
/// the [module doc](crate::conformance).
#[macro_export]
macro_rules! store_conformance_tests {
    ($open_fresh:expr, $open_second:expr) => {
        $crate::store_conformance_tests!($open_fresh, $open_second, attrs:);
    };
    ($open_fresh:expr, $open_second:expr, attrs: $(#[$attr:meta])*) => {
        $crate::__cw_conformance_store!(__CwConformanceStore, $open_fresh, $open_second);

        $crate::__cw_conformance_cases!(conformance, __CwConformanceStore, [$(#[$attr])*]
            read_your_writes,
            get_missing_key,
            set_clear_clear_range,
            range_reads,
            read_only_commit_has_no_version,
            read_hint_transaction_may_write,
            versionstamps,
            versionstamp_bad_offset_writes_nothing,
            reading_own_versionstamped_write_is_accessed_unreadable,
            commit_versions_increase_across_handles,
            versionstamps_unique_across_handles,
            versions_rise_about_one_million_per_second,
            read_version_rises_without_commits,
            atomic_add,
            atomic_add_concurrent_handles,
            atomic_byte_max,
            serializable_increments,
            serializable_increments_read_hint,
            retry_limit_on_persistent_conflict,
            retry_timeout_on_persistent_conflict,
            non_retryable_store_error_returned_at_once,
            failed_closure_commits_nothing,
            key_too_large,
            value_too_large,
            versionstamped_sizes_count_the_offset,
            transaction_too_large,
            watch_fires_on_own_change,
            watch_fires_on_other_handle_change,
            dropped_watch_is_harmless,
            watch_of_uncommitted_transaction_fails,
            close_fails_pending_watches,
        );
    };
}

mod atomics;
mod basics;
mod helpers;
mod limits;
mod retry;
mod versions;
mod watches;

pub use atomics::*;
pub use basics::*;
pub use limits::*;
pub use retry::*;
pub use versions::*;
pub use watches::*;
