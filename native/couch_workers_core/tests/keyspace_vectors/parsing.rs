//! Parsing keys and values back, after a commit where a versionstamp is
//! filled in.

use super::*;

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
pub(super) fn commit_versionstamp(param: &[u8], vs10: [u8; 10]) -> Vec<u8> {
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
