//! The key-space conformance suite: the workers, membership and job queue
//! code of this crate, run against every store (the embedded and `sim`
//! stores always; FoundationDB when `FDB_CLUSTER_FILE` is set), so that the very functions
//! the services call are proven on each store, not only the raw store
//! semantics that [`crate::conformance`] checks.
//!
//! It goes through the public surface only: the worker operations of
//! [`crate::workers`] over a [`Tx`](crate::store::Tx) in the one retry loop, and the job
//! queue through [`Node::with_db`] and [`Node::jobs`] (plus
//! [`crate::jobs::ops`] where a test needs an operation inside a
//! transaction of its own).
//!
//! # How a store plugs in
//!
//! Exactly as for [`crate::conformance`]: the same [`StoreFactory`]
//! (`open_fresh() -> TestDb`, `open_second(&first) -> TestDb`), and
//!
//! ```text
//! couch_workers_core::keyspace_conformance_tests!(open_fresh, open_second);
//! // or, with attributes put on every generated test:
//! couch_workers_core::keyspace_conformance_tests!(open_fresh, open_second, attrs: #[ignore = "needs FDB"]);
//! ```
//!
//! It may be invoked in the same test crate as `store_conformance_tests!`,
//! but in a module of its own (the two define a factory type each).
//!
//! Rules the suite keeps, and the store must allow:
//!
//! * every key it touches is the crate's key space under `db.prefix()`
//!   (`prefix ++ pack(("couch_workers", ...))`): a fresh store must be
//!   empty there;
//! * nodes started by a test (their reaper, sweeper and dispatchers) are
//!   stopped at its end with [`Node::stop`], which closes their handle;
//! * every test takes well under 3 s on an idle machine.
//!
//! Each behaviour is a `pub async fn(&dyn StoreFactory)`, callable on its
//! own, and each checks an outcome.

/// Expands the key-space conformance suite into one tokio test per
/// behaviour. See the [module doc](crate::conformance_keyspace).
#[macro_export]
macro_rules! keyspace_conformance_tests {
    ($open_fresh:expr, $open_second:expr) => {
        $crate::keyspace_conformance_tests!($open_fresh, $open_second, attrs:);
    };
    ($open_fresh:expr, $open_second:expr, attrs: $(#[$attr:meta])*) => {
        $crate::__cw_conformance_store!(__CwKeyspaceConformanceStore, $open_fresh, $open_second);

        $crate::__cw_conformance_cases!(conformance_keyspace, __CwKeyspaceConformanceStore, [$(#[$attr])*]
            workers_register_writes_member_health_and_bumps_vs,
            workers_register_again_is_a_new_incarnation,
            workers_heartbeat_renews_health_without_bumping_vs,
            workers_heartbeat_reinstates_a_removed_worker,
            workers_remove_clears_member_and_health_once,
            workers_remove_of_an_old_incarnation_leaves_the_new_one,
            workers_heartbeat_of_an_old_incarnation_renews_nothing,
            workers_read_membership_is_exactly_the_registered_set,
            workers_types_stay_separate,
            workers_reap_spares_a_renewed_worker,
            workers_reap_removes_the_observed_record,
            workers_reap_leaves_another_incarnation,
            workers_concurrent_reap_removes_once,
            membership_watch_fires_on_change_not_on_heartbeat,
            membership_changes_since_a_versionstamp,
            membership_changes_incomplete_when_log_trimmed,
            membership_watcher_incremental_matches_full_reads,
            jobs_add_get_pending_count,
            jobs_priority_then_fifo_across_handles,
            jobs_accept_needs_a_registered_worker,
            jobs_update_finish_fencing,
            jobs_cancel_pending_and_running,
            jobs_remove_running,
            jobs_failover_in_the_removing_transaction,
            jobs_add_many_all_or_nothing,
            jobs_blocking_accept_woken_by_other_handle,
        );
    };
}

mod helpers;
mod job_queue;
mod membership;
mod worker_records;

pub use job_queue::*;
pub use membership::*;
pub use worker_records::*;
