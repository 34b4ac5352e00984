//! The order of packed keys: what range reads and the queue rely on.

use super::*;

// ---- ordering ---------------------------------------------------------------

#[test]
fn integer_vectors_sort_numerically() {
    // INTS is in numeric order; its hand-written bytes must be too.
    for pair in INTS.windows(2) {
        assert!(h(pair[0].1) < h(pair[1].1), "{} !< {}", pair[0].0, pair[1].0);
    }
}

#[test]
fn pending_keys_run_by_priority_then_versionstamp() {
    for (ks, _) in both() {
        let keys: Vec<Vec<u8>> = INTS.iter().map(|(prio, _)| ks.pending(b"repl", *prio, &VS12, b"j")).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(sorted, keys, "priorities must sort numerically (lower runs first)");

        // -1 < 0 < 1 < 256
        let k = |prio| ks.pending(b"repl", prio, &VS12, b"j");
        assert!(k(-1) < k(0) && k(0) < k(1) && k(1) < k(256));

        // FIFO within a priority: an earlier commit, then an earlier batch
        // order, then a lower user version, whatever the job ids.
        let mut early = VS12;
        early[7] -= 1;
        assert!(ks.pending(b"repl", 0, &early, b"zzz") < ks.pending(b"repl", 0, &VS12, b"aaa"));
        let mut same_commit_lower_user = VS12;
        same_commit_lower_user[11] -= 1;
        assert!(ks.pending(b"repl", 0, &same_commit_lower_user, b"zzz") < ks.pending(b"repl", 0, &VS12, b"aaa"));
        // Any priority-0 job runs before any priority-1 job.
        assert!(ks.pending(b"repl", 0, &[0xff; 12], b"z") < ks.pending(b"repl", 1, &[0; 12], b"a"));
    }
}

#[test]
fn pending_range_holds_only_its_type() {
    for (ks, _) in both() {
        let (b, e) = ks.pending_range(b"rep");
        // "repl" is a longer name, not a sub-range of "rep".
        let other = ks.pending(b"repl", 0, &VS12, b"j");
        assert!(!(b <= other && other < e));
        let mine = ks.pending(b"rep", i64::MAX, &[0xff; 12], b"\xff\xff");
        assert!(b <= mine && mine < e);
    }
}

/// A range over "every key under (..., Name)" must not reach the keys of
/// (..., Name ++ "\0" ++ ...): packed, `Name ++ "\0"` is `01 Name 00 ff ..`,
/// which starts with the packed `(Name,)` = `01 Name 00`. The tuple layer's
/// own range for a packed prefix P is `[P ++ 00, P ++ ff)` (erlfdb
/// `erlfdb_tuple:range/1`, foundationdb-rs `Subspace::range`), which
/// excludes them; `strinc(P)` does not. keyspace.rs uses the tuple range
/// for every prefix.
#[test]
fn user_element_ranges_exclude_longer_names_with_nul() {
    for (ks, _) in both() {
        let inside = |(b, e): (Vec<u8>, Vec<u8>), key: &Vec<u8>| &b <= key && key < &e;
        assert!(!inside(ks.pending_range(b"rep"), &ks.pending(b"rep\x00", 0, &VS12, b"j")));
        assert!(!inside(ks.jobs_range(b"rep"), &ks.job(b"rep\x00", b"j")));
        // Unregistering worker "w" clears active_range(t, "w"): it must not
        // take the running jobs of worker "w\0" with it.
        assert!(!inside(ks.active_range(b"repl", b"w"), &ks.active(b"repl", b"w\x00", b"j")));
        // The reaper skips from one worker type to the next with this range.
        assert!(!inside(ks.worker_type_range(b"t"), &ks.member(b"t\x00", b"w")));
        assert!(inside(ks.worker_type_range(b"t"), &ks.health(b"t", b"w")));
    }
}

#[test]
fn member_ranges_do_not_overlap_between_types() {
    for (ks, _) in both() {
        for (a, b_) in [(&b"a"[..], &b"a\x00"[..]), (b"a", b"ab"), (b"", b"\x00"), (b"jobs", b"jobs_vs")] {
            let (begin, end) = ks.members_range(a);
            let other = ks.member(b_, b"w");
            assert!(!(begin <= other && other < end), "{a:?} range holds a member of {b_:?}");
            let mine = ks.member(a, b"\xff\xff");
            assert!(begin <= mine && mine < end);
        }
    }
}

#[test]
fn worker_types_named_like_subspaces_do_not_collide() {
    for (ks, _) in both() {
        for name in
            [&b"jobs"[..], b"pending", b"active", b"counts", b"jobs_vs", b"workers", b"vs", b"orphans", b"orphans_vs"]
        {
            let worker_keys = [ks.membership_vs(name), ks.member(name, b"w"), ks.health(name, b"w")];
            for key in &worker_keys {
                for (begin, end) in [
                    ks.jobs_range(b"w"),
                    ks.jobs_range(name),
                    ks.pending_range(name),
                    ks.active_range(name, b"w"),
                    ks.orphans_range(),
                ] {
                    assert!(!(&begin <= key && key < &end), "worker type {name:?} collides with the queue");
                }
                assert_eq!(ks.parse_pending(name, key), None);
                assert_eq!(ks.parse_active_job_id(name, b"w", key), None);
            }
            // And the other way: queue keys are not worker keys.
            for key in [
                ks.job(name, b"w"),
                ks.pending(name, 0, &VS12, b"w"),
                ks.active(name, b"w", b"j"),
                ks.pending_count(name),
                ks.jobs_vs(name),
                ks.orphan(name, b"w"),
                ks.orphans_vs(),
            ] {
                assert_eq!(ks.parse_worker_key(&key), None, "queue key parsed as a worker key");
                let (begin, end) = ks.all_workers_range();
                assert!(!(begin <= key && key < end));
            }
        }
    }
}
