//! Test vectors that pin the bytes of every key and value of the key space
//! (`couch_workers_core::keyspace`), under the empty prefix (the embedded
//! store) and under a directory prefix (FoundationDB's `couchdb`
//! directory; `15 0c` is the shape of a prefix the directory layer's
//! allocator hands out).
//!
//! Every expected value is written by hand from the FoundationDB tuple
//! layer spec (apple/foundationdb `design/tuple.md`), never by calling the
//! packer under test:
//!
//! * byte string: `01`, the bytes with each `00` written `00 ff`, then `00`;
//! * integer: `14` for zero; `15`..`1c` then the big-endian magnitude in
//!   1..8 bytes for a positive one; `13`..`0c` then the one's complement of
//!   the magnitude's big-endian bytes for a negative one;
//! * versionstamp (96-bit): `33`, the 10-byte transaction versionstamp,
//!   the 2-byte big-endian user version; an incomplete one has `ff` x 10,
//!   and the packed key or value ends with the placeholder's position as a
//!   4-byte little-endian offset (API version 520 and later), counted from
//!   the start of the whole key, prefix included.
//!
//! These are the bytes erlfdb writes too (apache/couchdb-erlfdb
//! `src/erlfdb_tuple.erl`): `encode(Bin, _) when is_binary(Bin) ->
//! [<<?BYTES>>, enc_null_terminated(Bin)]` with `-define(BYTES, 16#01)` and
//! `<<?NULL, ?ESCAPE>>` (`00 ff`) for an embedded NUL; integers use the
//! same codes (`?ZERO` 16#14, `?POS_INT_1..8` 16#15..16#1C, `?NEG_INT_1..8`
//! 16#13..16#0C, with the `bxor 16#FF` one's complement); `pack_vs/2`
//! writes `?VS96` (16#33) and appends `<<VsnPos:32/unsigned-little>>` with
//! `VsnPos = Pos + size(Prefix)`. So an Erlang node using erlfdb and the
//! prototype's binaries (`<<"couch_workers">>`) reads and writes the same
//! keys as this crate.

use couch_workers_core::keyspace::{version_of, Keyspace, WorkerKey};

/// Hand-written bytes. Tokens are separated by spaces: a token in single
/// quotes is ASCII text (no spaces), anything else is hex digits.
fn h(spec: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for token in spec.split_whitespace() {
        if let Some(text) = token.strip_prefix('\'') {
            let text = text.strip_suffix('\'').expect("closing quote");
            out.extend_from_slice(text.as_bytes());
        } else {
            assert!(token.len() % 2 == 0, "odd hex token {token:?}");
            for i in (0..token.len()).step_by(2) {
                out.push(u8::from_str_radix(&token[i..i + 2], 16).expect("hex"));
            }
        }
    }
    out
}

/// `h` of several parts, concatenated.
fn hs(parts: &[&str]) -> Vec<u8> {
    h(&parts.join(" "))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
}

#[track_caller]
fn same(actual: &[u8], expected: &[u8]) {
    assert_eq!(hex(actual), hex(expected));
}

// The schema's names, as tuple-layer byte strings, in plain hex.
/// ("couch_workers",)
const ROOT: &str = "01 636f7563685f776f726b657273 00";
/// strinc of ROOT: its last byte 00 -> 01.
const WORKERS: &str = "01 776f726b657273 00";
const VS: &str = "01 7673 00";
const MEMBER: &str = "01 6d656d626572 00";
const HEALTH: &str = "01 6865616c7468 00";
const JOBS: &str = "01 6a6f6273 00";
const PENDING: &str = "01 70656e64696e67 00";
const ACTIVE: &str = "01 616374697665 00";
const COUNTS: &str = "01 636f756e7473 00";
const JOBS_VS: &str = "01 6a6f62735f7673 00";
const ORPHANS: &str = "01 6f727068616e73 00";
const ORPHANS_VS: &str = "01 6f727068616e735f7673 00";
const REAPER_PULSE: &str = "01 'reaper_pulse' 00";
const HEALTH_VS: &str = "01 'health_vs' 00";
const RECEIPTS: &str = "01 7265636569707473 00";

/// A sample directory prefix (what the directory layer could allocate).
const DIR: &str = "15 0c";

fn both() -> [(Keyspace, &'static str); 2] {
    [(Keyspace::new(b""), ""), (Keyspace::new(&h(DIR)), DIR)]
}

/// A complete 12-byte tuple versionstamp: commit version 0x0102030405060708,
/// batch order 0x090a, user version 0x000b.
const VS12: [u8; 12] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 11];
const VS12_HEX: &str = "0102030405060708 090a 000b";

/// The tuple-layer integers, by hand (see the module doc).
const INTS: &[(i64, &str)] = &[
    (i64::MIN, "0c 7fffffffffffffff"),
    (i64::MIN + 1, "0c 8000000000000000"),
    (-1_000_000, "11 f0bdbf"),
    (-256, "12 feff"),
    (-255, "13 00"),
    (-1, "13 fe"),
    (0, "14"),
    (1, "15 01"),
    (255, "15 ff"),
    (256, "16 0100"),
    (1_000_000, "17 0f4240"),
    (1_700_000_000, "18 6553f100"),
    (i64::MAX, "1c 7fffffffffffffff"),
];

// ---- the root -------------------------------------------------------------

#[test]
fn root_range_empty_prefix() {
    let (begin, end) = Keyspace::new(b"").root_range();
    same(&begin, &hs(&[ROOT, "00"]));
    same(&end, &hs(&[ROOT, "ff"]));
    assert_eq!(begin.len(), 16);
}

#[test]
fn root_range_directory_prefix() {
    let (begin, end) = Keyspace::new(&h(DIR)).root_range();
    same(&begin, &hs(&[DIR, ROOT, "00"]));
    same(&end, &hs(&[DIR, ROOT, "ff"]));
}

// ---- workers ------------------------------------------------------------

#[test]
fn membership_vs_key() {
    for (ks, p) in both() {
        same(&ks.membership_vs(b"repl"), &hs(&[p, ROOT, WORKERS, "01 'repl' 00", VS]));
    }
}

#[test]
fn member_and_health_keys() {
    for (ks, p) in both() {
        same(
            &ks.member(b"repl", b"node1@127.0.0.1"),
            &hs(&[p, ROOT, WORKERS, "01 'repl' 00", MEMBER, "01 'node1@127.0.0.1' 00"]),
        );
        same(
            &ks.health(b"repl", b"node1@127.0.0.1"),
            &hs(&[p, ROOT, WORKERS, "01 'repl' 00", HEALTH, "01 'node1@127.0.0.1' 00"]),
        );
    }
}

#[test]
fn worker_type_prefix_bytes() {
    for (ks, p) in both() {
        same(&ks.worker_type_prefix(b"repl"), &hs(&[p, ROOT, WORKERS, "01 'repl' 00"]));
        same(&ks.worker_type_prefix(b"a\x00"), &hs(&[p, ROOT, WORKERS, "01 61 00ff 00"]));
    }
}

#[test]
fn worker_type_with_nul_and_empty_worker() {
    // "a\0b": the NUL is escaped as 00 ff; the empty id is 01 00.
    for (ks, p) in both() {
        same(&ks.member(b"a\x00b", b""), &hs(&[p, ROOT, WORKERS, "01 61 00ff 62 00", MEMBER, "01 00"]));
        same(&ks.health(b"", b"\x00"), &hs(&[p, ROOT, WORKERS, "01 00", HEALTH, "01 00ff 00"]));
        same(&ks.membership_vs(b"\x00\x00"), &hs(&[p, ROOT, WORKERS, "01 00ff00ff 00", VS]));
    }
}

#[test]
fn high_bytes_are_not_escaped() {
    // Only 00 is escaped; ff and other bytes stand for themselves.
    let ks = Keyspace::new(b"");
    same(&ks.member(b"\xff\x01", b"\xfe"), &hs(&[ROOT, WORKERS, "01 ff01 00", MEMBER, "01 fe 00"]));
}

#[test]
fn worker_ranges() {
    for (ks, p) in both() {
        let (b, e) = ks.members_range(b"repl");
        same(&b, &hs(&[p, ROOT, WORKERS, "01 'repl' 00", MEMBER, "00"]));
        same(&e, &hs(&[p, ROOT, WORKERS, "01 'repl' 00", MEMBER, "ff"]));
        let (b, e) = ks.health_range(b"repl");
        same(&b, &hs(&[p, ROOT, WORKERS, "01 'repl' 00", HEALTH, "00"]));
        same(&e, &hs(&[p, ROOT, WORKERS, "01 'repl' 00", HEALTH, "ff"]));
        let (b, e) = ks.all_workers_range();
        same(&b, &hs(&[p, ROOT, WORKERS, "00"]));
        same(&e, &hs(&[p, ROOT, WORKERS, "ff"]));
    }
}

#[test]
fn health_value_bytes() {
    // (incomplete VS with user version 0, tstamp, timeout, incarnation as
    // a byte string) ++ offset 1 LE.
    same(
        &Keyspace::health_value(1_700_000_000, 15, &[0x11; 16]),
        &h("33 ffffffffffffffffffff 0000 18 6553f100 15 0f 01 11111111111111111111111111111111 00 01000000"),
    );
    // A NUL byte of the incarnation is escaped, as in every byte string.
    let counting: [u8; 16] = std::array::from_fn(|i| i as u8);
    same(
        &Keyspace::health_value(0, 1, &counting),
        &h("33 ffffffffffffffffffff 0000 14 15 01 01 00ff 0102030405060708090a0b0c0d0e0f 00 01000000"),
    );
    same(
        &Keyspace::health_value(-1, i64::MAX, &[0xff; 16]),
        &h("33 ffffffffffffffffffff 0000 13 fe 1c 7fffffffffffffff 01 ffffffffffffffffffffffffffffffff 00 01000000"),
    );
}

#[test]
fn membership_vs_placeholder_value() {
    // A raw 10-byte placeholder at offset 0: the stored value is the bare VS.
    same(&Keyspace::vs_placeholder_value(), &h("ffffffffffffffffffff 00000000"));
}

// ---- jobs -----------------------------------------------------------------

#[test]
fn job_key() {
    for (ks, p) in both() {
        same(&ks.job(b"repl", b"job-1"), &hs(&[p, ROOT, JOBS, "01 'repl' 00", "01 'job-1' 00"]));
        same(&ks.job(b"", b"\x00\xff"), &hs(&[p, ROOT, JOBS, "01 00", "01 00ff ff 00"]));
    }
}

/// The tuple range `[P ++ 00, P ++ ff)`; see `user_element_ranges_exclude_longer_names_with_nul`.
#[test]
fn jobs_range_bytes() {
    for (ks, p) in both() {
        let (b, e) = ks.jobs_range(b"repl");
        same(&b, &hs(&[p, ROOT, JOBS, "01 'repl' 00", "00"]));
        same(&e, &hs(&[p, ROOT, JOBS, "01 'repl' 00", "ff"]));
    }
}

#[test]
fn pending_key_every_priority_shape() {
    for (ks, p) in both() {
        for (prio, prio_hex) in INTS {
            same(
                &ks.pending(b"repl", *prio, &VS12, b"j1"),
                &hs(&[p, ROOT, PENDING, "01 'repl' 00", prio_hex, "33", VS12_HEX, "01 'j1' 00"]),
            );
        }
    }
}

#[test]
fn pending_new_versionstamp_offset_counts_the_prefix() {
    // Empty prefix: ROOT (15) + PENDING (9) + "repl" (6) + priority 0 (1)
    // = 31 bytes before the 0x33, so the placeholder starts at 32 = 0x20.
    let ks = Keyspace::new(b"");
    same(
        &ks.pending_new(b"repl", 0, 5, b"j1"),
        &hs(&[ROOT, PENDING, "01 'repl' 00", "14", "33 ffffffffffffffffffff 0005", "01 'j1' 00", "20000000"]),
    );
    // Priority -1 takes two bytes: placeholder at 33 = 0x21.
    same(
        &ks.pending_new(b"repl", -1, 0, b"j1"),
        &hs(&[ROOT, PENDING, "01 'repl' 00", "13 fe", "33 ffffffffffffffffffff 0000", "01 'j1' 00", "21000000"]),
    );
    // Under the 2-byte directory prefix everything moves by 2: 34 = 0x22.
    let ks = Keyspace::new(&h(DIR));
    same(
        &ks.pending_new(b"repl", 0, 0xffff, b"j1"),
        &hs(&[DIR, ROOT, PENDING, "01 'repl' 00", "14", "33 ffffffffffffffffffff ffff", "01 'j1' 00", "22000000"]),
    );
}

/// The tuple range `[P ++ 00, P ++ ff)`; see `user_element_ranges_exclude_longer_names_with_nul`.
#[test]
fn pending_range_bytes() {
    for (ks, p) in both() {
        let (b, e) = ks.pending_range(b"repl");
        same(&b, &hs(&[p, ROOT, PENDING, "01 'repl' 00", "00"]));
        same(&e, &hs(&[p, ROOT, PENDING, "01 'repl' 00", "ff"]));
    }
}

#[test]
fn active_key_and_range() {
    for (ks, p) in both() {
        same(
            &ks.active(b"repl", b"w1", b"job-1"),
            &hs(&[p, ROOT, ACTIVE, "01 'repl' 00", "01 'w1' 00", "01 'job-1' 00"]),
        );
        let (b, e) = ks.active_range(b"repl", b"w1");
        same(&b, &hs(&[p, ROOT, ACTIVE, "01 'repl' 00", "01 'w1' 00", "00"]));
        same(&e, &hs(&[p, ROOT, ACTIVE, "01 'repl' 00", "01 'w1' 00", "ff"]));
    }
}

#[test]
fn counts_and_jobs_vs_keys() {
    for (ks, p) in both() {
        same(&ks.pending_count(b"repl"), &hs(&[p, ROOT, COUNTS, "01 'repl' 00", PENDING]));
        same(&ks.jobs_vs(b"repl"), &hs(&[p, ROOT, JOBS_VS, "01 'repl' 00"]));
    }
}

// ---- orphans ----------------------------------------------------------------

#[test]
fn orphan_keys_and_range() {
    for (ks, p) in both() {
        same(&ks.orphan(b"repl", b"w1"), &hs(&[p, ROOT, ORPHANS, "01 'repl' 00", "01 'w1' 00"]));
        same(&ks.orphan(b"", b"\x00"), &hs(&[p, ROOT, ORPHANS, "01 00", "01 00ff 00"]));
        same(&ks.orphans_vs(), &hs(&[p, ROOT, ORPHANS_VS]));
        let (b, e) = ks.orphans_range();
        same(&b, &hs(&[p, ROOT, ORPHANS, "00"]));
        same(&e, &hs(&[p, ROOT, ORPHANS, "ff"]));
        // ("orphans_vs",) shares the bytes "orphans" but is not in the range:
        // after them comes 5f ('_'), not the terminator 00.
        let vs = ks.orphans_vs();
        assert!(!(b <= vs && vs < e));
    }
}

// ---- receipts ---------------------------------------------------------------

#[test]
fn receipt_keys_and_old_range() {
    for (ks, p) in both() {
        same(&ks.receipt(1, b"tok"), &hs(&[p, ROOT, RECEIPTS, "15 01", "01 'tok' 00"]));
        same(&ks.receipt(256, b"\x00"), &hs(&[p, ROOT, RECEIPTS, "16 0100", "01 00ff 00"]));
        let (b, e) = ks.receipts_before(256);
        same(&b, &hs(&[p, ROOT, RECEIPTS, "00"]));
        same(&e, &hs(&[p, ROOT, RECEIPTS, "16 0100"]));
        // Minute 255 is cleared with everything before 256; 256 is kept.
        assert!(b <= ks.receipt(255, b"tok") && ks.receipt(255, b"tok") < e);
        assert!(ks.receipt(256, b"") >= e);
    }
}

// ---- reapers ----------------------------------------------------------------

#[test]
fn health_vs_key() {
    for (ks, p) in both() {
        same(&ks.health_vs(), &hs(&[p, ROOT, HEALTH_VS]));
        same(&ks.health_vs(), &hs(&[p, ROOT, "01 6865616c74685f7673 00"]));
        assert_eq!(ks.parse_worker_key(&ks.health_vs()), None);
        let (begin, end) = ks.all_workers_range();
        assert!(!(begin <= ks.health_vs() && ks.health_vs() < end));
    }
}

// ---- promoters and pruners (issue 16) -------------------------------------

/// The two global wake-up keys sort outside every per-type subspace they
/// could be confused with: `scheduled_vs` is not in `scheduled`'s range,
/// `expiry_vs` not in `expiry`'s (the pruner reads that range in order).
#[test]
fn scheduled_vs_and_expiry_vs_keys() {
    for (ks, p) in both() {
        same(&ks.scheduled_vs(), &hs(&[p, ROOT, "01 7363686564756c65645f7673 00"]));
        same(&ks.expiry_vs(), &hs(&[p, ROOT, "01 6578706972795f7673 00"]));
        let (begin, end) = ks.scheduled_range(b"");
        assert!(!(begin <= ks.scheduled_vs() && ks.scheduled_vs() < end));
        let (begin, end) = ks.expiry_range();
        assert!(!(begin <= ks.expiry_vs() && ks.expiry_vs() < end));
        assert_eq!(ks.parse_expiry(&ks.expiry_vs()), None);
    }
}

#[test]
fn reaper_pulse_key() {
    for (ks, p) in both() {
        same(&ks.reaper_pulse(), &hs(&[p, ROOT, REAPER_PULSE]));
        same(&ks.reaper_pulse(), &hs(&[p, ROOT, "01 7265617065725f70756c7365 00"]));
        assert_eq!(ks.parse_worker_key(&ks.reaper_pulse()), None);
        let (begin, end) = ks.all_workers_range();
        assert!(!(begin <= ks.reaper_pulse() && ks.reaper_pulse() < end));
    }
}

#[test]
fn parse_orphan_round_trips() {
    for (ks, _) in both() {
        for (wt, w) in [(&b"repl"[..], &b"w1"[..]), (b"a\x00", b""), (b"orphans", b"orphans_vs")] {
            assert_eq!(ks.parse_orphan(&ks.orphan(wt, w)), Some((wt.to_vec(), w.to_vec())));
        }
        assert_eq!(ks.parse_orphan(&ks.orphans_vs()), None);
        assert_eq!(ks.parse_orphan(&ks.job(b"repl", b"w1")), None, "a job key is not an orphan marker");
        assert_eq!(ks.parse_orphan(&ks.jobs_vs(b"repl")), None);
    }
}

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

// ---- parsing ------------------------------------------------------------------

#[test]
fn parse_worker_key_round_trips() {
    for (ks, _) in both() {
        for (wt, w) in [(&b"repl"[..], &b"node1"[..]), (b"a\x00b", b""), (b"", b"\x00\xff"), (b"jobs", b"pending")] {
            assert_eq!(
                ks.parse_worker_key(&ks.member(wt, w)),
                Some(WorkerKey::Member { worker_type: wt.to_vec(), worker: w.to_vec() })
            );
            assert_eq!(
                ks.parse_worker_key(&ks.health(wt, w)),
                Some(WorkerKey::Health { worker_type: wt.to_vec(), worker: w.to_vec() })
            );
            assert_eq!(ks.parse_worker_key(&ks.membership_vs(wt)), Some(WorkerKey::Vs { worker_type: wt.to_vec() }));
        }
    }
}

#[test]
fn parse_rejects_keys_of_another_prefix() {
    let plain = Keyspace::new(b"");
    let dir = Keyspace::new(&h(DIR));
    assert_eq!(dir.parse_worker_key(&plain.member(b"t", b"w")), None);
    assert_eq!(plain.parse_worker_key(&dir.member(b"t", b"w")), None);
    assert_eq!(dir.parse_pending(b"t", &plain.pending(b"t", 0, &VS12, b"j")), None);
    assert_eq!(dir.parse_active_job_id(b"t", b"w", &plain.active(b"t", b"w", b"j")), None);
}

#[test]
fn parse_pending_round_trips() {
    for (ks, _) in both() {
        for (prio, _) in INTS {
            for id in [&b"j1"[..], b"", b"\x00", b"\xff\x00\xff"] {
                let key = ks.pending(b"t\x00", *prio, &VS12, id);
                assert_eq!(ks.parse_pending(b"t\x00", &key), Some((*prio, VS12, id.to_vec())));
                // Another type's parser refuses it.
                assert_eq!(ks.parse_pending(b"t", &key), None);
            }
        }
    }
}

#[test]
fn parse_active_round_trips() {
    for (ks, _) in both() {
        let key = ks.active(b"repl", b"w\x00", b"job\x00");
        assert_eq!(ks.parse_active_job_id(b"repl", b"w\x00", &key), Some(b"job\x00".to_vec()));
        assert_eq!(ks.parse_active_job_id(b"repl", b"w", &key), None);
    }
}

/// What FoundationDB does at commit with a versionstamped parameter: drop
/// the 4-byte little-endian offset and write the 10-byte versionstamp there.
fn commit_versionstamp(param: &[u8], vs10: [u8; 10]) -> Vec<u8> {
    let (body, offset) = param.split_at(param.len() - 4);
    let at = u32::from_le_bytes(offset.try_into().unwrap()) as usize;
    let mut out = body.to_vec();
    out[at..at + 10].copy_from_slice(&vs10);
    out
}

#[test]
fn health_value_parses_after_commit() {
    let vs10 = [0, 0, 0, 0, 0x3b, 0x9a, 0xca, 0x00, 0x00, 0x07];
    let stored = commit_versionstamp(&Keyspace::health_value(1_700_000_000, 15, &[0x22; 16]), vs10);
    same(&stored, &h("33 000000003b9aca00 0007 0000 18 6553f100 15 0f 01 22222222222222222222222222222222 00"));
    let health = Keyspace::parse_health(&stored).expect("health parses");
    assert_eq!(health.versionstamp, vs10);
    assert_eq!(health.tstamp, 1_700_000_000);
    assert_eq!(health.timeout_s, 15);
    assert_eq!(health.incarnation, Some([0x22; 16]));
    assert_eq!(health.version(), 1_000_000_000);
    assert_eq!(version_of(&vs10), 1_000_000_000);
    // The uncommitted parameter is not a health value.
    assert!(Keyspace::parse_health(&Keyspace::health_value(1, 1, &[0; 16])).is_none());
}

#[test]
fn health_values_before_incarnations_parse_as_no_incarnation() {
    // Written before incarnations: (VS, TStamp, Timeout).
    let legacy = h("33 000000003b9aca00 0007 0000 18 6553f100 15 0f");
    let health = Keyspace::parse_health(&legacy).expect("a legacy record parses");
    assert_eq!((health.timeout_s, health.incarnation), (15, None));
    // An incarnation of another length is no record of ours.
    assert!(Keyspace::parse_health(&h("33 000000003b9aca00 0007 0000 18 6553f100 15 0f 01 2222 00")).is_none());
}

#[test]
fn pending_new_commits_to_a_parseable_pending_key() {
    for (ks, _) in both() {
        let vs10 = [0, 0, 0, 0, 0, 0, 0, 42, 0, 1];
        let key = commit_versionstamp(&ks.pending_new(b"repl", -7, 3, b"j1"), vs10);
        let mut vs12 = [0u8; 12];
        vs12[..10].copy_from_slice(&vs10);
        vs12[10..].copy_from_slice(&3u16.to_be_bytes());
        assert_eq!(ks.parse_pending(b"repl", &key), Some((-7, vs12, b"j1".to_vec())));
        assert_eq!(key, ks.pending(b"repl", -7, &vs12, b"j1"));
    }
}

#[test]
fn membership_vs_value_is_the_bare_versionstamp() {
    let vs10 = [9, 8, 7, 6, 5, 4, 3, 2, 1, 0];
    assert_eq!(commit_versionstamp(&Keyspace::vs_placeholder_value(), vs10), vs10.to_vec());
}

// ---- the membership change log ----------------------------------------------

#[test]
fn membership_log_keys() {
    for (ks, p) in both() {
        // ("couch_workers", "workers", "repl", "log", <incomplete VS>, "w1") ++ offset
        let mut expect = hs(&[p, ROOT, WORKERS, "01 'repl' 00", "01 'log' 00", "33 ffffffffffffffffffff 0000", "01 'w1' 00"]);
        // The placeholder starts after prefix + root (15) + "workers" (9) +
        // "repl" (6) + "log" (5) + the 0x33 code (1).
        let placeholder_at = h(p).len() + 36;
        expect.extend_from_slice(&(placeholder_at as u32).to_le_bytes());
        let key = ks.membership_log_new(b"repl", b"w1");
        assert_eq!(&key[placeholder_at..placeholder_at + 10], &[0xff; 10]);
        same(&key, &expect);
        same(&ks.membership_log_floor(b"repl"), &hs(&[p, ROOT, WORKERS, "01 'repl' 00", "01 'log_floor' 00"]));
        // A completed entry parses back; "after" sorts after every entry of its commit.
        let vs = [0, 0, 0, 0, 0, 0, 0, 7, 0, 1];
        let complete = hs(&[p, ROOT, WORKERS, "01 'repl' 00", "01 'log' 00", "33 00000000000000070001 0000", "01 'w1' 00"]);
        match ks.parse_worker_key(&complete) {
            Some(couch_workers_core::keyspace::WorkerKey::Log { worker_type, vs: got, worker }) => {
                assert_eq!((worker_type.as_slice(), got, worker.as_slice()), (&b"repl"[..], vs, &b"w1"[..]));
            }
            other => panic!("not a log key: {other:?}"),
        }
        assert!(ks.membership_log_after(b"repl", &vs) > complete);
        let (b, e) = ks.membership_log_range(b"repl");
        assert!(b < complete && complete < e);
        assert!(ks.membership_log_at_version(b"repl", 7) < complete);
        assert!(ks.membership_log_at_version(b"repl", 8) > complete);
    }
}

// ---- issue 13: scheduled jobs, per-state counts and indexes, types,
// ---- expiry, pause ----------------------------------------------------------

const SCHEDULED: &str = "01 7363686564756c6564 00";
const BY_STATE: &str = "01 62795f7374617465 00";
const TYPES: &str = "01 7479706573 00";
const EXPIRY: &str = "01 657870697279 00";
const PAUSED: &str = "01 706175736564 00";

#[test]
fn state_count_keys() {
    for (ks, p) in both() {
        same(&ks.state_count(b"repl", b"failed"), &hs(&[p, ROOT, COUNTS, "01 'repl' 00", "01 'failed' 00"]));
        // The pending count is the state count of `pending`.
        same(&ks.state_count(b"repl", b"pending"), &ks.pending_count(b"repl"));
    }
}

#[test]
fn scheduled_keys_and_ranges() {
    for (ks, p) in both() {
        same(
            &ks.scheduled(b"repl", 1_700_000_000, b"j\x00"),
            &hs(&[p, ROOT, SCHEDULED, "01 'repl' 00", "18 6553f100", "01 6a 00ff 00"]),
        );
        let (b, e) = ks.scheduled_range(b"repl");
        same(&b, &hs(&[p, ROOT, SCHEDULED, "01 'repl' 00", "00"]));
        same(&e, &hs(&[p, ROOT, SCHEDULED, "01 'repl' 00", "ff"]));
        // Everything due at or before 255 sorts before the key of 256.
        same(&ks.scheduled_after(b"repl", 255), &hs(&[p, ROOT, SCHEDULED, "01 'repl' 00", "16 0100"]));
        assert!(ks.scheduled(b"repl", 255, b"\xff\xff") < ks.scheduled_after(b"repl", 255));
        assert!(ks.scheduled(b"repl", 256, b"") >= ks.scheduled_after(b"repl", 255));
        same(&ks.scheduled_after(b"repl", i64::MAX), &e);
        assert_eq!(ks.parse_scheduled(b"repl", &ks.scheduled(b"repl", 7, b"j")), Some((7, b"j".to_vec())));
        assert_eq!(ks.parse_scheduled(b"other", &ks.scheduled(b"repl", 7, b"j")), None);
    }
}

#[test]
fn by_state_keys_and_range() {
    for (ks, p) in both() {
        same(
            &ks.by_state(b"repl", b"running", b"job-1"),
            &hs(&[p, ROOT, BY_STATE, "01 'repl' 00", "01 'running' 00", "01 'job-1' 00"]),
        );
        let (b, e) = ks.by_state_range(b"repl", b"running");
        same(&b, &hs(&[p, ROOT, BY_STATE, "01 'repl' 00", "01 'running' 00", "00"]));
        same(&e, &hs(&[p, ROOT, BY_STATE, "01 'repl' 00", "01 'running' 00", "ff"]));
        let key = ks.by_state(b"repl", b"running", b"job-1");
        assert_eq!(ks.parse_by_state(b"repl", b"running", &key), Some(b"job-1".to_vec()));
        assert_eq!(ks.parse_by_state(b"repl", b"pending", &key), None);
    }
}

#[test]
fn job_type_count_keys() {
    for (ks, p) in both() {
        same(&ks.job_type_count(b"repl"), &hs(&[p, ROOT, TYPES, "01 'repl' 00"]));
        let (b, e) = ks.job_types_range();
        same(&b, &hs(&[p, ROOT, TYPES, "00"]));
        same(&e, &hs(&[p, ROOT, TYPES, "ff"]));
        assert_eq!(ks.parse_job_type(&ks.job_type_count(b"a\x00b")), Some(b"a\x00b".to_vec()));
        assert_eq!(ks.parse_job_type(&ks.jobs_vs(b"repl")), None);
    }
}

#[test]
fn expiry_keys_and_ranges() {
    for (ks, p) in both() {
        same(
            &ks.expiry(1_000_000, b"repl", b"job-1"),
            &hs(&[p, ROOT, EXPIRY, "17 0f4240", "01 'repl' 00", "01 'job-1' 00"]),
        );
        let (b, e) = ks.expiry_range();
        same(&b, &hs(&[p, ROOT, EXPIRY, "00"]));
        same(&e, &hs(&[p, ROOT, EXPIRY, "ff"]));
        same(&ks.expiry_after(255), &hs(&[p, ROOT, EXPIRY, "16 0100"]));
        assert_eq!(
            ks.parse_expiry(&ks.expiry(9, b"t", b"i")),
            Some((9, b"t".to_vec(), b"i".to_vec()))
        );
    }
}

#[test]
fn paused_key() {
    for (ks, p) in both() {
        same(&ks.paused(b"repl"), &hs(&[p, ROOT, PAUSED, "01 'repl' 00"]));
    }
}

#[test]
fn job_types_named_like_the_new_subspaces_do_not_collide() {
    for (ks, _) in both() {
        let names: [&[u8]; 5] = [b"scheduled", b"by_state", b"types", b"expiry", b"paused"];
        let mut keys = Vec::new();
        for name in names {
            keys.extend([
                ks.job(name, b"j"),
                ks.scheduled(name, 1, b"j"),
                ks.by_state(name, b"pending", b"j"),
                ks.job_type_count(name),
                ks.expiry(1, name, b"j"),
                ks.paused(name),
                ks.state_count(name, b"pending"),
            ]);
        }
        let n = keys.len();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), n);
    }
}

/// The job record as a job write stores it, format 3: a pending job added
/// at Unix ms 1,700,000,000,000 (`0x018bcfe56800`, six bytes), default
/// options, read raw from an embedded store. Every byte but the commit's
/// 10-byte versionstamp is pinned; the last element, `QueuedAt`, is the
/// time it became pending.
#[test]
fn job_record_value_bytes() {
    use couch_workers_core::jobs::{ops, JobOpts, JobSpec};
    use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
    use couch_workers_core::store::{run, Db, TxOptions};

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let stored = rt.block_on(async {
        let db: Db = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open");
        let ks = &Keyspace::new(&db.prefix());
        let jobs = [JobSpec { id: b"j".to_vec(), info: b"{}".to_vec(), opts: JobOpts::default() }];
        let j = &jobs;
        run(db.as_ref(), TxOptions::write(), |tx| async move { ops::add_many_jobs(&tx, ks, b"t", j, 1_700_000_000_000).await })
            .await
            .expect("add")
            .expect("added");
        let key = ks.job(b"t", b"j");
        let k = &key;
        let v = run(db.as_ref(), TxOptions::read(), |tx| async move { tx.get(k, false).await }).await.expect("read");
        db.close();
        v.expect("the record")
    });
    // (3, "pending", nil, 0, 0, nil, false, VS
    let head = h("15 03 01 'pending' 00 00 14 14 00 26 33");
    // VS's user version 0, then "{}", nil, nil, 20, nil, -1, nil, nil, 1700000000000)
    let tail = h("0000 01 '{}' 00 00 00 15 14 00 13 fe 00 00 1a 018bcfe56800");
    assert_eq!(stored.len(), head.len() + 10 + tail.len(), "{}", hex(&stored));
    same(&stored[..head.len()], &head);
    same(&stored[head.len() + 10..], &tail);
}
