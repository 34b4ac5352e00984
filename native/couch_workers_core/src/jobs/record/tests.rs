//! The job record's and the other values' encodings: round trips, the
//! older formats still read, the bytes of each format.

use super::*;

/// What the store does with a versionstamped value.
fn commit(param: &[u8], stamp: [u8; 10]) -> Vec<u8> {
    let (bytes, off) = param.split_at(param.len() - 4);
    let off = u32::from_le_bytes(off.try_into().unwrap()) as usize;
    let mut out = bytes.to_vec();
    out[off..off + 10].copy_from_slice(&stamp);
    out
}

#[test]
fn round_trip_binary_safe() {
    let rec = Record {
        state: JobState::Running,
        worker: Some(b"w\x00\xff".to_vec()),
        priority: i64::MIN,
        attempts: 3,
        token: Some([7; 16]),
        cancel_requested: true,
        vs: incomplete_vs(9),
        info: b"{\"a\":1}".to_vec(),
        result: None,
        error: Some(b"{}".to_vec()),
        max_attempts: MaxAttempts::Infinity,
        run_at: Some(17),
        keep: Keep::Seconds(0),
        expire_at: Some(u64::MAX >> 1),
        queued_at: Some(1_700_000_000_123),
        // NUL bytes, which the tuple layer escapes.
        incarnation: Some([0, 0xff, 0, 1, 2, 3, 0, 0]),
        unique: None,
        group: None,
        activity_timeout: None,
        run_started_at: None,
        run_ended: None,
        resubmit: Some(Resubmit {
            info: b"{\"b\":2}".to_vec(),
            opts: JobOpts {
                priority: Some(-3),
                schedule: Some(Schedule::Delay(5)),
                max_attempts: Some(MaxAttempts::Limit(2)),
                keep: None,
                unique: None,
                group: None,
                activity_timeout: None,
            },
        }),
    };
    let stored = commit(&rec.encode(9), [1; 10]);
    assert_eq!(stored.len() + 4, rec.value_len(), "FDB counts the stored bytes and the 4-byte offset");
    let back = Record::decode(&stored).unwrap();
    let mut expect = rec.clone();
    expect.vs = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 9];
    assert_eq!(back, expect);
}

#[test]
fn format_1_is_read_with_defaults() {
    let v1 = pack_with_versionstamp(&(
        1i64,
        Bytes::from(&b"pending"[..]),
        None::<Bytes>,
        4i64,
        0u64,
        None::<Bytes>,
        false,
        TupleVs::incomplete(0),
        Bytes::from(&b"{}"[..]),
        None::<Bytes>,
    ));
    let rec = Record::decode(&commit(&v1, [4; 10])).unwrap();
    assert_eq!(rec.state, JobState::Pending);
    assert_eq!(rec.priority, 4);
    assert_eq!(rec.max_attempts, MaxAttempts::DEFAULT);
    assert_eq!(rec.keep, Keep::Infinity);
    assert_eq!((rec.error, rec.run_at, rec.resubmit), (None, None, None));
}

/// The elements of `rec` as stored, less its last `drop` ones, under
/// format `format`: what an older version wrote.
fn older(rec: &Record, format: i64, drop: usize) -> Vec<Element<'static>> {
    let stored = commit(&rec.encode(0), [6; 10]);
    let mut e: Vec<Element> = unpack::<Vec<Element>>(&stored).unwrap().into_iter().map(|e| e.into_owned()).collect();
    e.truncate(e.len() - drop);
    e[0] = Element::Int(format);
    e
}

#[test]
fn format_3_is_read_without_incarnation() {
    let rec = Record::new(b"{}".to_vec(), &JobOpts::default());
    assert!(rec.incarnation.is_some());
    // Format 3 is format 4 less its last element.
    let mut e = older(&rec, 3, 1);
    let back = Record::decode(&foundationdb_tuple::pack(&e)).unwrap();
    assert_eq!(Record { incarnation: None, vs: back.vs, ..rec.clone() }, back);
    // Rewritten by this code, it stays without one (format 4, nil).
    let again = Record::decode(&commit(&back.encode(0), [7; 10])).unwrap();
    assert_eq!(again.incarnation, None);
    // A format 4 record of seventeen elements, or format 3 of eighteen: corrupt.
    e[0] = Element::Int(4);
    assert!(Record::decode(&foundationdb_tuple::pack(&e)).is_err());
    let mut e = older(&rec, 3, 0);
    assert!(Record::decode(&foundationdb_tuple::pack(&e)).is_err());
    // An incarnation of another length: corrupt.
    e[0] = Element::Int(4);
    e[17] = Element::Bytes(vec![1; 7].into());
    assert!(Record::decode(&foundationdb_tuple::pack(&e)).is_err());
}

#[test]
fn format_2_is_read_without_queued_at() {
    let mut rec = Record::new(b"{}".to_vec(), &JobOpts::default());
    rec.queued_at = Some(5);
    // Format 2 is format 4 less its last two elements.
    let mut e = older(&rec, 2, 2);
    let back = Record::decode(&foundationdb_tuple::pack(&e)).unwrap();
    assert_eq!(back.queued_at, None);
    assert_eq!(Record { queued_at: None, incarnation: None, vs: back.vs, ..rec }, back);
    // A format 3 record of sixteen elements, or format 2 of seventeen: corrupt.
    e[0] = Element::Int(3);
    assert!(Record::decode(&foundationdb_tuple::pack(&e)).is_err());
}

#[test]
fn each_new_record_has_its_own_incarnation_of_one_size() {
    let a = Record::new(b"{}".to_vec(), &JobOpts::default());
    let b = Record::new(b"{}".to_vec(), &JobOpts::default());
    assert_ne!(a.incarnation, b.incarnation);
    // No zero byte (escaped by the tuple layer): every new record of
    // the same data has the same size.
    let len = a.value_len();
    for _ in 0..1000 {
        let r = Record::new(b"{}".to_vec(), &JobOpts::default());
        assert!(!r.incarnation.unwrap().contains(&0));
        assert_eq!(r.value_len(), len);
    }
}

#[test]
fn format_5_holds_the_unique_key_and_only_a_job_with_one_is_written_so() {
    let plain = Record::new(b"{}".to_vec(), &JobOpts::default());
    let stored = commit(&plain.encode(0), [6; 10]);
    assert_eq!(unpack::<Vec<Element>>(&stored).unwrap()[0], Element::Int(4), "no unique key: format 4");
    let opts = JobOpts { unique: Some(b"k\x00\xff".to_vec()), ..JobOpts::default() };
    let rec = Record::new(b"{}".to_vec(), &opts);
    let stored = commit(&rec.encode(0), [6; 10]);
    let e = unpack::<Vec<Element>>(&stored).unwrap();
    assert_eq!((e.len(), &e[0]), (19, &Element::Int(5)));
    let back = Record::decode(&stored).unwrap();
    assert_eq!(back, Record { vs: back.vs, ..rec.clone() });
    // Format 5 of eighteen elements, a nil key, or format 4 of nineteen: corrupt.
    let mut e: Vec<Element> = e.into_iter().map(|e| e.into_owned()).collect();
    e[18] = Element::Nil;
    assert!(Record::decode(&foundationdb_tuple::pack(&e)).is_err());
    e[0] = Element::Int(4);
    e[18] = Element::Bytes(b"k".to_vec().into());
    assert!(Record::decode(&foundationdb_tuple::pack(&e)).is_err());
    e.truncate(18);
    e[0] = Element::Int(5);
    assert!(Record::decode(&foundationdb_tuple::pack(&e)).is_err());
}

#[test]
fn format_6_holds_group_and_activity_timeout_and_only_a_job_with_one_is_written_so() {
    use crate::jobs::job::ActivityTimeout;
    for (group, timeout, unique) in [
        (Some(b"tenant\x00a".to_vec()), None, None),
        (None, Some(ActivityTimeout::Seconds(61)), Some(b"k".to_vec())),
        (Some(b"g".to_vec()), Some(ActivityTimeout::Infinity), None),
    ] {
        let opts = JobOpts { group: group.clone(), activity_timeout: timeout, unique, ..JobOpts::default() };
        let rec = Record::new(b"{}".to_vec(), &opts);
        let stored = commit(&rec.encode(0), [6; 10]);
        let e = unpack::<Vec<Element>>(&stored).unwrap();
        assert_eq!((e.len(), &e[0]), (21, &Element::Int(6)));
        let back = Record::decode(&stored).unwrap();
        assert_eq!(back, Record { vs: back.vs, ..rec.clone() });
        assert_eq!((back.to_job(b"t", b"i", 0).group, back.to_job(b"t", b"i", 0).activity_timeout), (group, timeout));
        // Format 6 of twenty elements, a timeout of 0, or format 5 of
        // twenty-one: corrupt.
        let mut e: Vec<Element> = e.into_iter().map(|e| e.into_owned()).collect();
        let mut short = e.clone();
        short.truncate(20);
        assert!(Record::decode(&foundationdb_tuple::pack(&short)).is_err());
        e[20] = Element::Int(0);
        assert!(Record::decode(&foundationdb_tuple::pack(&e)).is_err());
        e[20] = Element::Nil;
        e[0] = Element::Int(5);
        assert!(Record::decode(&foundationdb_tuple::pack(&e)).is_err());
    }
    // A deferred resubmit keeps both options; one without them keeps the
    // six-element value older nodes read.
    let mut rec = Record::new(b"{}".to_vec(), &JobOpts::default());
    let with = JobOpts {
        group: Some(b"g2".to_vec()),
        activity_timeout: Some(ActivityTimeout::Seconds(5)),
        ..JobOpts::default()
    };
    rec.resubmit = Some(Resubmit { info: b"{}".to_vec(), opts: with.clone() });
    let back = Record::decode(&commit(&rec.encode(0), [6; 10])).unwrap();
    assert_eq!(back.resubmit.unwrap().opts, with);
    let plain = Resubmit { info: b"{}".to_vec(), opts: JobOpts::priority(1) };
    assert_eq!(unpack::<Vec<Element>>(&encode_resubmit(&plain)).unwrap().len(), 6);
}

#[test]
fn format_7_holds_the_run_and_only_a_job_that_ran_is_written_so() {
    use crate::jobs::job::Outcome;
    let opts = JobOpts { group: Some(b"g".to_vec()), ..JobOpts::default() };
    let mut rec = Record::new(b"{}".to_vec(), &opts);
    // Running: its start, its worker in `Worker`.
    rec.state = JobState::Running;
    rec.worker = Some(b"w\x00".to_vec());
    rec.token = Some([1; 16]);
    rec.attempts = 1;
    rec.run_started_at = Some(1_700_000_000_000);
    let stored = commit(&rec.encode(0), [6; 10]);
    let e = unpack::<Vec<Element>>(&stored).unwrap();
    assert_eq!((e.len(), &e[0]), (25, &Element::Int(7)));
    assert_eq!(&e[22..], &[Element::Nil, Element::Nil, Element::Nil]);
    let back = Record::decode(&stored).unwrap();
    assert_eq!(back, Record { vs: back.vs, ..rec.clone() });
    // Ended: the worker moves into the run's end.
    rec.state = JobState::Finished;
    rec.worker = None;
    rec.token = None;
    rec.run_ended = Some(RunEnded { worker: b"w\x00".to_vec(), ended_at: 1_700_000_000_500, outcome: Outcome::Timeout });
    let stored = commit(&rec.encode(0), [6; 10]);
    let back = Record::decode(&stored).unwrap();
    assert_eq!(back, Record { vs: back.vs, ..rec.clone() });
    // A run's end in part, an unknown outcome, or format 6 of twenty-five
    // elements: corrupt.
    let e: Vec<Element> = unpack::<Vec<Element>>(&stored).unwrap().into_iter().map(|e| e.into_owned()).collect();
    let mut part = e.clone();
    part[23] = Element::Nil;
    assert!(Record::decode(&foundationdb_tuple::pack(&part)).is_err());
    let mut unknown = e.clone();
    unknown[24] = Element::Bytes(b"sleeping".to_vec().into());
    assert!(Record::decode(&foundationdb_tuple::pack(&unknown)).is_err());
    let mut six = e;
    six[0] = Element::Int(6);
    assert!(Record::decode(&foundationdb_tuple::pack(&six)).is_err());
    // A job that has not run keeps its older format.
    let fresh = Record::new(b"{}".to_vec(), &JobOpts::default());
    assert_eq!(unpack::<Vec<Element>>(&commit(&fresh.encode(0), [6; 10])).unwrap()[0], Element::Int(4));
}

/// Format 7's bytes: the format first, and the run's four elements after
/// format 6's three (nil), as the tuple layer packs them.
#[test]
fn format_7_bytes() {
    use crate::jobs::job::Outcome;
    let mut rec = Record::new(b"{}".to_vec(), &JobOpts::default());
    rec.state = JobState::Finished;
    rec.attempts = 1;
    rec.run_started_at = Some(1_700_000_000_000);
    rec.run_ended = Some(RunEnded { worker: b"w".to_vec(), ended_at: 1_700_000_000_500, outcome: Outcome::Finished });
    let stored = commit(&rec.encode(0), [6; 10]);
    // (7, ...
    assert_eq!(&stored[..2], &[0x15, 0x07]);
    // ..., nil, nil, nil, 1700000000000 (6 bytes: 0x1a), "w", 1700000000500, "finished")
    let mut tail = vec![0x00, 0x00, 0x00, 0x1a, 0x01, 0x8b, 0xcf, 0xe5, 0x68, 0x00, 0x01, b'w', 0x00];
    tail.extend([0x1a, 0x01, 0x8b, 0xcf, 0xe5, 0x69, 0xf4, 0x01]);
    tail.extend(b"finished");
    tail.push(0x00);
    assert!(stored.ends_with(&tail), "{stored:02x?}");
}

/// The widest record a job can become bounds both a running record and
/// the record its run's end leaves (the worker's id then in the run's
/// end, with the run's times and outcome).
#[test]
fn the_largest_record_bounds_a_run_and_its_end() {
    use crate::jobs::job::Outcome;
    let worker = vec![b'w'; 40];
    let mut rec = Record::new(vec![b'i'; 500], &JobOpts::default());
    let bound = rec.largest_len(worker.len());
    rec.state = JobState::Running;
    rec.worker = Some(worker.clone());
    rec.token = Some([0; 16]);
    rec.attempts = 1;
    rec.run_started_at = Some(u64::MAX);
    assert!(rec.value_len() <= bound);
    assert_eq!(rec.running_len(&worker), rec.value_len(), "running_len counts the run's start");
    rec.state = JobState::Scheduled;
    rec.worker = None;
    rec.token = None;
    rec.run_at = Some(u64::MAX);
    rec.queued_at = Some(u64::MAX);
    rec.error = Some(worker_lost_error());
    rec.run_ended = Some(RunEnded { worker, ended_at: u64::MAX, outcome: Outcome::Released });
    assert!(rec.value_len() <= bound, "{} > {bound}", rec.value_len());
}

#[test]
fn unknown_format_is_refused() {
    let v = foundationdb_tuple::pack(&(4i64, Bytes::from(&b"pending"[..])));
    assert!(matches!(Record::decode(&v), Err(StoreError::Invalid(_))));
    assert!(Record::decode(b"\xff\xff").is_err());
}

#[test]
fn active_and_marker_round_trip() {
    let a = commit(&encode_active(5), [2; 10]);
    assert_eq!(decode_active(&a), Some([2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 5]));
    let m = commit(&encode_orphan_marker(false, &[]), [3; 10]);
    assert_eq!(decode_orphan_marker(&m), Some(([3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 0, 0], false)));
    let m = commit(&encode_orphan_marker(true, &[]), [3; 10]);
    assert_eq!(decode_orphan_marker(&m), Some(([3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 0, 0], true)));
    // Earlier removals keep their own rules.
    let earlier = [([1; 12], false), ([2; 12], true)];
    let m = commit(&encode_orphan_marker(false, &earlier), [3; 10]);
    let latest = ([3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 0, 0], false);
    assert_eq!(decode_orphan_marker(&m), Some(latest));
    assert_eq!(decode_orphan_removals(&m), Some(vec![earlier[0], earlier[1], latest]));
}
