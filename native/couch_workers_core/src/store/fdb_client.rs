//! Whose FoundationDB client this process runs: the decision the FDB
//! store's network boot (`store/fdb/network.rs`) takes from libfdb_c's
//! answers. Kept apart from it, free of the `foundationdb` crate, so that
//! it is compiled and tested without the `fdb` feature.
//!
//! libfdb_c is one per OS process and shared by every user in it: in a
//! CouchDB node, erlfdb's NIF and couch_workers' NIF load the same
//! `libfdb_c.so`. `fdb_select_api_version` succeeds once per process
//! (`fdb_c.cpp`: "Can only call this once", 2201 `api_version_already_set`)
//! and `fdb_setup_network` once (2009 `network_already_setup`). When one of
//! them answers "already", another client of this process (erlfdb) owns the
//! client: couch_workers uses its network and must neither start a second
//! one nor stop it.

/// `fdb_select_api_version` was already called in this process.
pub const API_VERSION_ALREADY_SET: i32 = 2201;
/// `fdb_setup_network` was already called in this process.
pub const NETWORK_ALREADY_SETUP: i32 = 2009;
/// The installed libfdb_c does not support the requested API version.
pub const API_VERSION_NOT_SUPPORTED: i32 = 2203;

/// What to do after `fdb_select_api_version` answered `code` (0: success).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterSelect {
    /// This process's first client: set up and run the network.
    SetUpNetwork,
    /// Another client selected the version and owns the network.
    UseShared,
    /// Cannot continue; the message says why.
    Fail(String),
}

/// What to do after `fdb_setup_network` answered `code` (0: success).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterSetup {
    /// couch_workers owns the network: run it, and stop it at exit.
    RunOwned,
    /// Another client set it up: use it, never stop it.
    UseShared,
    /// Cannot continue; the message says why.
    Fail(String),
}

/// Decides on `fdb_select_api_version`'s answer for `version`.
pub fn after_select(code: i32, version: i32) -> AfterSelect {
    match code {
        0 => AfterSelect::SetUpNetwork,
        API_VERSION_ALREADY_SET => AfterSelect::UseShared,
        API_VERSION_NOT_SUPPORTED => AfterSelect::Fail(format!(
            "the installed libfdb_c does not support FoundationDB API version {version} (error 2203): \
             install the FoundationDB client library 7.1 or newer"
        )),
        code => AfterSelect::Fail(format!("selecting FoundationDB API version {version} failed: FDB error {code}")),
    }
}

/// Decides on `fdb_setup_network`'s answer.
pub fn after_setup(code: i32) -> AfterSetup {
    match code {
        0 => AfterSetup::RunOwned,
        NETWORK_ALREADY_SETUP => AfterSetup::UseShared,
        code => AfterSetup::Fail(format!("setting up the FoundationDB client network failed: FDB error {code}")),
    }
}

/// `commit_unknown_result`: FoundationDB could not tell whether the
/// commit landed.
pub const COMMIT_UNKNOWN_RESULT: i32 = 1021;
/// `transaction_timed_out`: the transaction's `timeout` option ended it.
pub const TRANSACTION_TIMED_OUT: i32 = 1031;
/// `cluster_version_changed`: the cluster's protocol changed under the
/// client (an upgrade); FoundationDB counts it as maybe committed.
pub const CLUSTER_VERSION_CHANGED: i32 = 1039;

/// Whether a commit that failed with `code` may have landed all the same.
///
/// The transaction's `timeout` option (set from the retry loop's budget)
/// cancels whatever the transaction waits on, its commit too: libfdb_c
/// then fails the commit with 1031 `transaction_timed_out`, though the
/// commit request may already be at a proxy and land later. Seen on a
/// real cluster (scripts/fdb-faults.sh, fault 2: fdbserver stopped with
/// SIGSTOP): `job_add` answered `{error, timeout}` after 5,000 ms and the
/// job was in the store once the server ran again. Such a commit is
/// `commit_unknown_result` for the caller (the retry loop then checks
/// receipts, or answers `commit_unknown_result` when no time is left),
/// never a plain timeout, which says nothing was written. FoundationDB's
/// own "maybe committed" predicate holds for 1021 and for 1039
/// `cluster_version_changed` (a commit interrupted by a client upgrade).
pub fn commit_may_have_landed(code: i32) -> bool {
    matches!(code, COMMIT_UNKNOWN_RESULT | TRANSACTION_TIMED_OUT | CLUSTER_VERSION_CHANGED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_cut_off_by_the_transaction_timeout_may_have_landed() {
        assert!(commit_may_have_landed(1031));
        assert!(commit_may_have_landed(1021));
        assert!(commit_may_have_landed(1039));
        // Conflict, too old, too large: the commit did not land.
        for code in [1020, 1007, 2101, 2103] {
            assert!(!commit_may_have_landed(code), "{code}");
        }
    }

    #[test]
    fn first_client_sets_up_and_owns_the_network() {
        assert_eq!(after_select(0, 710), AfterSelect::SetUpNetwork);
        assert_eq!(after_setup(0), AfterSetup::RunOwned);
    }

    #[test]
    fn a_client_already_in_the_process_is_shared_not_an_error() {
        // erlfdb loaded first: its version and its network are used.
        assert_eq!(after_select(2201, 710), AfterSelect::UseShared);
        assert_eq!(after_setup(2009), AfterSetup::UseShared);
    }

    #[test]
    fn other_answers_fail_with_the_reason() {
        match after_select(2203, 710) {
            AfterSelect::Fail(msg) => assert!(msg.contains("710") && msg.contains("7.1 or newer"), "{msg}"),
            other => panic!("expected Fail, got {other:?}"),
        }
        match after_select(2200, 710) {
            AfterSelect::Fail(msg) => assert!(msg.contains("2200"), "{msg}"),
            other => panic!("expected Fail, got {other:?}"),
        }
        match after_setup(4100) {
            AfterSetup::Fail(msg) => assert!(msg.contains("4100"), "{msg}"),
            other => panic!("expected Fail, got {other:?}"),
        }
    }
}
