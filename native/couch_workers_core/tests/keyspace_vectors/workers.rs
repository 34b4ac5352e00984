//! The root, workers (membership, health), reapers and the membership
//! change log.

use super::*;

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

// ---- the membership change log ----------------------------------------------

#[test]
fn membership_log_keys() {
    for (ks, p) in both() {
        // ("couch_workers", "workers", "repl", "log", <incomplete VS>, "w1") ++ offset
        let mut expect =
            hs(&[p, ROOT, WORKERS, "01 'repl' 00", "01 'log' 00", "33 ffffffffffffffffffff 0000", "01 'w1' 00"]);
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
        let complete =
            hs(&[p, ROOT, WORKERS, "01 'repl' 00", "01 'log' 00", "33 00000000000000070001 0000", "01 'w1' 00"]);
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

// ---- leadership: the order of registrations ---------------------------------

#[test]
fn registered_and_seniority_keys() {
    for (ks, p) in both() {
        same(
            &ks.registered(b"repl", b"w1"),
            &hs(&[p, ROOT, WORKERS, "01 'repl' 00", "01 'registered' 00", "01 'w1' 00"]),
        );
        // ("couch_workers", "workers", "repl", "seniority", <incomplete VS>, "w1") ++ offset
        let mut expect =
            hs(&[p, ROOT, WORKERS, "01 'repl' 00", "01 'seniority' 00", "33 ffffffffffffffffffff 0000", "01 'w1' 00"]);
        // prefix + root (15) + "workers" (9) + "repl" (6) + "seniority" (11) + the 0x33 code (1).
        let placeholder_at = h(p).len() + 42;
        expect.extend_from_slice(&(placeholder_at as u32).to_le_bytes());
        let key = ks.seniority_new(b"repl", b"w1");
        assert_eq!(&key[placeholder_at..placeholder_at + 10], &[0xff; 10]);
        same(&key, &expect);
        // The committed key, found again from the `registered` value.
        let vs = [0, 0, 0, 0, 0, 0, 0, 7, 0, 1];
        let complete =
            hs(&[p, ROOT, WORKERS, "01 'repl' 00", "01 'seniority' 00", "33 00000000000000070001 0000", "01 'w1' 00"]);
        same(&ks.seniority(b"repl", &vs, b"w1"), &complete);
        assert_eq!(
            ks.parse_worker_key(&complete),
            Some(WorkerKey::Seniority { worker_type: b"repl".to_vec(), vs, worker: b"w1".to_vec() })
        );
        assert_eq!(
            ks.parse_worker_key(&ks.registered(b"repl", b"w1")),
            Some(WorkerKey::Registered { worker_type: b"repl".to_vec(), worker: b"w1".to_vec() })
        );
        let (b, e) = ks.seniority_range(b"repl");
        same(&b, &hs(&[p, ROOT, WORKERS, "01 'repl' 00", "01 'seniority' 00", "00"]));
        same(&e, &hs(&[p, ROOT, WORKERS, "01 'repl' 00", "01 'seniority' 00", "ff"]));
        // An older registration's key sorts first: the leader.
        assert!(ks.seniority(b"repl", &[0, 0, 0, 0, 0, 0, 0, 6, 0, 9], b"zz") < complete);
    }
}

#[test]
fn epochs_order_as_their_seniority_keys() {
    use couch_workers_core::workers::epoch;
    let (a, b) = ([0, 0, 0, 0, 0, 0, 0, 7, 0, 1], [0, 0, 0, 0, 0, 0, 0, 8, 0, 0]);
    assert_eq!(epoch(&a, b"w1"), h("00000000000000070001 'w1'"));
    // One commit, two ids: the id that sorts first leads first, with the smaller epoch.
    for (x, y) in [(&b"w"[..], &b"w\x00"[..]), (b"w\x00", b"w\x01"), (b"a", b"b"), (b"zz", b"zz\xff")] {
        let ks = Keyspace::new(b"");
        assert!(ks.seniority(b"t", &a, x) < ks.seniority(b"t", &a, y));
        assert!(epoch(&a, x) < epoch(&a, y));
    }
    assert!(epoch(&a, b"zzzz") < epoch(&b, b"a"), "a later commit's epoch is greater");
}
