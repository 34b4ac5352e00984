//! Jobs: records, the pending and active indexes, counts, orphans,
//! receipts, schedules, per-state indexes, types, expiry and pause.

use super::*;

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

// ---- scheduled jobs, per-state counts and indexes, types, expiry, pause ----

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
        assert_eq!(ks.parse_expiry(&ks.expiry(9, b"t", b"i")), Some((9, b"t".to_vec(), b"i".to_vec())));
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

/// The job record as a job write stores it, format 4: a pending job added
/// at Unix ms 1,700,000,000,000 (`0x018bcfe56800`, six bytes), default
/// options, read raw from an embedded store. Every byte is pinned but the
/// commit's 10-byte versionstamp and the 8 random bytes of the last
/// element, `Incarnation` (its framing and length are pinned, its bytes
/// those the job reads back); `QueuedAt`, before it, is the time it
/// became pending.
#[test]
fn job_record_value_bytes() {
    use couch_workers_core::jobs::{ops, JobOpts, JobSpec};
    use couch_workers_core::store::embedded::{EmbeddedOptions, EmbeddedStore};
    use couch_workers_core::store::{run, Db, TxOptions};

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let (stored, incarnation) = rt.block_on(async {
        let db: Db = EmbeddedStore::open(EmbeddedOptions::new(dir.path())).expect("open");
        let ks = &Keyspace::new(&db.prefix());
        let jobs = [JobSpec { id: b"j".to_vec(), info: b"{}".to_vec(), opts: JobOpts::default() }];
        let j = &jobs;
        run(db.as_ref(), TxOptions::write(), |tx| async move {
            ops::add_many_jobs(&tx, ks, b"t", j, 1_700_000_000_000).await
        })
        .await
        .expect("add")
        .expect("added");
        let key = ks.job(b"t", b"j");
        let k = &key;
        let v = run(db.as_ref(), TxOptions::read(), |tx| async move { tx.get(k, false).await }).await.expect("read");
        let job = run(db.as_ref(), TxOptions::read(), |tx| async move { ops::get(&tx, ks, b"t", b"j").await })
            .await
            .expect("read")
            .expect("the job");
        db.close();
        (v.expect("the record"), job.incarnation.expect("an incarnation"))
    });
    // (4, "pending", nil, 0, 0, nil, false, VS
    let head = h("15 04 01 'pending' 00 00 14 14 00 26 33");
    // VS's user version 0, then "{}", nil, nil, 20, nil, -1, nil, nil, 1700000000000,
    let mut tail = h("0000 01 '{}' 00 00 00 15 14 00 13 fe 00 00 1a 018bcfe56800");
    // Incarnation: 8 random bytes, none zero (so none escaped), the job's own.)
    assert!(!incarnation.contains(&0), "{incarnation:?}");
    tail.push(0x01);
    tail.extend_from_slice(&incarnation);
    tail.push(0x00);
    assert_eq!(stored.len(), head.len() + 10 + tail.len(), "{}", hex(&stored));
    same(&stored[..head.len()], &head);
    same(&stored[head.len() + 10..], &tail);
}

// ---- promoters and pruners ------------------------------------------------

/// The two global wake-up keys sort outside every subspace they could be
/// confused with: `scheduled_vs` is not in a type's `scheduled` range,
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

// ---- recurring jobs -----------------------------------------------------------

#[test]
fn schedule_keys() {
    for (ks, p) in both() {
        let record = hs(&[p, ROOT, "01 'schedules' 00", "01 'db_expiration' 00", "01 's1' 00"]);
        same(&ks.schedule(b"db_expiration", b"s1"), &record);
        assert_eq!(ks.parse_schedule(b"db_expiration", &record), Some(b"s1".to_vec()));
        assert_eq!(ks.parse_schedule(b"other", &record), None);
        let (b, e) = ks.schedules_range(b"db_expiration");
        same(&b, &hs(&[p, ROOT, "01 'schedules' 00", "01 'db_expiration' 00", "00"]));
        same(&e, &hs(&[p, ROOT, "01 'schedules' 00", "01 'db_expiration' 00", "ff"]));
        // 1_700_000_000 packs as 18 6553f100.
        let due = hs(&[p, ROOT, "01 'schedule_due' 00", "18 6553f100", "01 't' 00", "01 's' 00"]);
        same(&ks.schedule_due(1_700_000_000, b"t", b"s"), &due);
        assert_eq!(ks.parse_schedule_due(&due), Some((1_700_000_000, b"t".to_vec(), b"s".to_vec())));
        same(&ks.schedule_due_after(1_700_000_000), &hs(&[p, ROOT, "01 'schedule_due' 00", "18 6553f101"]));
        assert!(ks.schedule_due_after(1_700_000_000) > due);
        let (b, e) = ks.schedule_due_range();
        same(&b, &hs(&[p, ROOT, "01 'schedule_due' 00", "00"]));
        same(&e, &hs(&[p, ROOT, "01 'schedule_due' 00", "ff"]));
        same(&ks.schedules_vs(), &hs(&[p, ROOT, "01 'schedules_vs' 00"]));
    }
}

#[test]
fn schedule_record_value_bytes() {
    use couch_workers_core::jobs::{JobOpts, Keep};
    use couch_workers_core::schedules::record::Record;
    let rec = Record {
        spec_json: b"{}".to_vec(),
        info: b"{}".to_vec(),
        opts: JobOpts { priority: Some(1), keep: Some(Keep::Infinity), ..JobOpts::default() },
        next_run_at: 1_700_000_000,
        last_run: Some(b"s@1".to_vec()),
    };
    // (1, "{}", "{}", 1, nil, -1, 1700000000, "s@1")
    same(&rec.encode(), &h("15 01  01 '{}' 00  01 '{}' 00  15 01  00  13 fe  18 6553f100  01 's@1' 00"));
}

// ---- job type settings ----------------------------------------------------

/// `("couch_workers", "type_settings", JobType)` and its value, format 1:
/// `(1, ActivityTimeout, MaxRunning, MaxRunningPerGroup)`, `-1` for
/// infinity.
#[test]
fn type_settings_key_and_value() {
    use couch_workers_core::jobs::{TypeSetting, TypeSettings};
    for (ks, p) in both() {
        same(&ks.type_settings(b"repl"), &hs(&[p, ROOT, "01 'type_settings' 00 01 'repl' 00"]));
        let (begin, end) = ks.job_types_range();
        assert!(!(begin <= ks.type_settings(b"t") && ks.type_settings(b"t") < end));
    }
    let s = TypeSettings::default()
        .with(&[TypeSetting::ActivityTimeout(Some(300)), TypeSetting::MaxRunningPerGroup(Some(8))])
        .expect("valid");
    same(&s.encode(), &h("15 01 16 012c 13 fe 15 08"));
    same(&TypeSettings::default().encode(), &h("15 01 13 fe 13 fe 13 fe"));
}

// ---- unique keys ----------------------------------------------------------

/// `("couch_workers", "unique", JobType, Key)`, beside the subspaces it
/// could be confused with.
#[test]
fn unique_key() {
    for (ks, p) in both() {
        same(&ks.unique(b"repl", b"k\x00"), &hs(&[p, ROOT, "01 'unique' 00 01 'repl' 00 01 6b 00ff 00"]));
        let (begin, end) = ks.jobs_range(b"unique");
        assert!(!(begin <= ks.unique(b"t", b"k") && ks.unique(b"t", b"k") < end));
    }
}

// ---- run history ----------------------------------------------------------

/// `("couch_workers", "history", JobType, JobId, Run, Part)`, a run's
/// prefix and the job's range.
#[test]
fn history_keys() {
    for (ks, p) in both() {
        same(&ks.history_part(b"t", b"j", 256, 1), &hs(&[p, ROOT, "01 'history' 00 01 74 00 01 6a 00 16 0100 15 01"]));
        same(&ks.history_run(b"t", b"j", 0), &hs(&[p, ROOT, "01 'history' 00 01 74 00 01 6a 00 14"]));
        let (begin, end) = ks.history_range(b"t", b"j");
        same(&begin, &hs(&[p, ROOT, "01 'history' 00 01 74 00 01 6a 00 00"]));
        same(&end, &hs(&[p, ROOT, "01 'history' 00 01 74 00 01 6a 00 ff"]));
        assert_eq!(ks.parse_history(b"t", b"j", &ks.history_part(b"t", b"j", 7, 0)), Some((7, 0)));
        assert_eq!(ks.parse_history(b"t", b"j\0", &ks.history_part(b"t", b"j", 7, 0)), None);
    }
}

// ---- running limits -------------------------------------------------------

/// `("couch_workers", "group_running", JobType, Group)`, outside every
/// type's job records.
#[test]
fn group_running_key() {
    for (ks, p) in both() {
        same(&ks.group_running(b"repl", b"g\x00"), &hs(&[p, ROOT, "01 'group_running' 00 01 'repl' 00 01 67 00ff 00"]));
        let (begin, end) = ks.jobs_range(b"group_running");
        assert!(!(begin <= ks.group_running(b"t", b"g") && ks.group_running(b"t", b"g") < end));
    }
}

// ---- activity timeouts' index -----------------------------------------------

/// `("couch_workers", "activity", JobType, TimeoutS, VS, JobId)`: written
/// with an incomplete versionstamp, it commits to the key of the record's
/// `vs`, which parses back; `activity_after` ends the keys changed at or
/// before a commit version (every batch order and job id of it), before
/// the next version's and the next timeout's.
#[test]
fn activity_key() {
    use super::parsing::commit_versionstamp;
    let ks = Keyspace::new(b"");
    same(
        &ks.activity_new(b"repl", 30, 5, b"j1"),
        &hs(&[
            ROOT,
            "01 'activity' 00",
            "01 'repl' 00",
            "15 1e",
            "33 ffffffffffffffffffff 0005",
            "01 'j1' 00",
            "22000000",
        ]),
    );
    for (ks, _) in both() {
        let vs10 = [0, 0, 0, 0, 0, 0, 0, 42, 0, 1];
        let key = commit_versionstamp(&ks.activity_new(b"repl", 30, 3, b"j1"), vs10);
        let mut vs12 = [0u8; 12];
        vs12[..10].copy_from_slice(&vs10);
        vs12[10..].copy_from_slice(&3u16.to_be_bytes());
        assert_eq!(key, ks.activity(b"repl", 30, &vs12, b"j1"));
        assert_eq!(ks.parse_activity(&key), Some((b"repl".to_vec(), 30, vs12, b"j1".to_vec())));
        let (begin, end) = ks.activity_bucket_range(b"repl", 30);
        assert!(begin < key && key < ks.activity_after(b"repl", 30, 42) && ks.activity_after(b"repl", 30, 42) < end);
        assert!(ks.activity_after(b"repl", 30, 41) < key, "changed after version 41");
        let next_version = ks.activity(b"repl", 30, &[0, 0, 0, 0, 0, 0, 0, 43, 0, 0, 0, 0], b"");
        assert!(ks.activity_after(b"repl", 30, 42) < next_version);
        assert!(end <= ks.activity_bucket_range(b"repl", 31).0, "one timeout's keys before the next's");
        let (all_begin, all_end) = ks.activity_range();
        assert!(all_begin < begin && end < all_end);
    }
}
