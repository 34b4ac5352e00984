//! Recurring jobs: a schedule's slots each create exactly one job, with
//! the slot's id `ScheduleId@T`, in the transaction that moves the
//! schedule on; several nodes fire them, one of them stopped and started
//! again mid-run, and every slot runs once, none twice; `catch_up`
//! decides what runs after slots were missed; `overlap` false skips a
//! slot while the previous run is active; bad specs say why.

mod jobs_common;

use std::collections::BTreeSet;
use std::time::Duration;

use couch_workers_core::jobs::{wall_ms, JobOpts, JobState};
use couch_workers_core::leaders::Leadership;
use couch_workers_core::leadership::LeaderFence;
use couch_workers_core::recurring::Schedules;
use couch_workers_core::schedules::ops::{self, slot_job_id};
use couch_workers_core::schedules::spec::Spec;
use couch_workers_core::store::{run, TxOptions};
use couch_workers_core::{Error, Jobs, Node};
use jobs_common::*;

const T: &[u8] = b"db_expiration";

fn schedules(node: &Node) -> Schedules {
    Schedules::new(node.context().clone())
}

async fn set(node: &Node, id: &[u8], spec: &str) {
    schedules(node).set(T, id, spec.as_bytes(), b"{\"db\":\"x\"}", &JobOpts::default(), None).await.expect("set");
}

/// The ids of the type's jobs of schedule `id`, as slot times.
async fn slots(node: &Node, id: &[u8]) -> Vec<u64> {
    let (jobs, _) = Jobs::new(node.context().clone()).list(T, None, 1000, None).await.expect("list");
    let prefix = [id, b"@"].concat();
    let mut at: Vec<u64> = jobs
        .iter()
        .filter_map(|j| j.id.strip_prefix(prefix.as_slice()))
        .map(|rest| std::str::from_utf8(rest).expect("utf8").parse().expect("a slot"))
        .collect();
    at.sort();
    at
}

async fn bad_specs_say_why_and_write_nothing(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let s = schedules(&node);
    for (spec, why) in [
        (r#"{"every": 999}"#, "at least 1000"),
        (r#"{"cron": "not a cron"}"#, "cron"),
        (r#"{"every": 1000, "color": "red"}"#, "unknown key color"),
        (r#"{}"#, "neither every nor cron"),
    ] {
        match s.set(T, b"s", spec.as_bytes(), b"{}", &JobOpts::default(), None).await {
            Err(Error::BadSchedule(w)) => assert!(w.contains(why), "{spec}: {w}"),
            other => panic!("{spec}: {other:?}"),
        }
    }
    assert!(s.list(T).await.expect("list").is_empty(), "nothing written");
    assert_eq!(s.remove(T, b"s").await, Err(Error::NotFound));
    node.stop().await;
}

async fn set_lists_and_remove_and_a_set_replaces_from_its_next_slot(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let s = schedules(&node);
    let opts = JobOpts { priority: Some(5), ..JobOpts::default() };
    s.set(T, b"hourly", br#"{"every": 3600000}"#, b"{\"n\":1}", &opts, None).await.expect("set");
    let now = wall_ms();
    let listed = s.list(T).await.expect("list");
    assert_eq!(listed.len(), 1);
    let e = &listed[0];
    assert_eq!(e.id, b"hourly");
    assert_eq!(e.spec_json, br#"{"every":3600000,"overlap":false,"catch_up":"latest"}"#.to_vec());
    assert_eq!((e.info.as_slice(), e.opts.priority, e.last_run.as_ref()), (&b"{\"n\":1}"[..], Some(5), None));
    assert_eq!(e.next_run_at % 3_600_000, 0);
    assert!(e.next_run_at >= now - 1000 && e.next_run_at <= now + 3_600_000);
    // Replaced: the new spec from its next slot.
    s.set(T, b"hourly", br#"{"cron": "0 0 1 1 *", "catch_up": "none"}"#, b"{}", &JobOpts::default(), None)
        .await
        .expect("set again");
    let listed = s.list(T).await.expect("list");
    assert_eq!(listed.len(), 1);
    assert!(listed[0].next_run_at > now + 3_600_000, "next new year's midnight");
    assert_eq!(listed[0].next_run_at % 86_400_000, 0);
    s.remove(T, b"hourly").await.expect("remove");
    assert!(s.list(T).await.expect("list").is_empty());
    assert_eq!(s.remove(T, b"hourly").await, Err(Error::NotFound));
    node.stop().await;
}

/// Fires a slot at an explicit `now`, as a runner would.
async fn fire(node: &Node, id: &[u8], due_at: u64, now: u64) -> ops::Fired {
    let ks = node.keyspace().clone();
    run(node.db().as_ref(), TxOptions::write(), |tx| {
        let ks = ks.clone();
        async move { ops::fire(&tx, &ks, T, id, due_at, now).await }
    })
    .await
    .expect("fire")
}

async fn set_at(node: &Node, id: &[u8], spec: &str, now: u64) -> u64 {
    let ks = node.keyspace().clone();
    let spec = Spec::parse(spec.as_bytes()).expect("spec");
    run(node.db().as_ref(), TxOptions::write(), |tx| {
        let (ks, spec) = (ks.clone(), spec.clone());
        async move { ops::set(&tx, &ks, T, id, &spec, b"{}", &JobOpts::default(), now).await }
    })
    .await
    .expect("set")
    .expect("a good spec");
    schedules(node).list(T).await.expect("list").into_iter().find(|e| e.id == id).expect("listed").next_run_at
}

/// The cluster was down from slot `first` to 5.5 s later: `latest` runs
/// the last slot, `none` none, `all` each; then the schedule goes on from
/// its first slot after the look.
async fn catch_up_decides_what_runs_after_missed_slots(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let t0 = 1_900_000_000_000;
    for (id, mode, expect) in [
        (&b"latest"[..], "latest", vec![t0 + 5000]),
        (b"none", "none", vec![]),
        (b"all", "all", (0..=5).map(|k| t0 + k * 1000).collect()),
    ] {
        let spec = format!(r#"{{"every": 1000, "catch_up": "{mode}", "overlap": true}}"#);
        let first = set_at(&node, id, &spec, t0 - 500).await;
        assert_eq!(first, t0);
        let fired = fire(&node, id, first, t0 + 5500).await;
        assert!(!fired.stale);
        assert_eq!(slots(&node, id).await, expect, "catch_up {mode}");
        let entry = schedules(&node).list(T).await.expect("list").into_iter().find(|e| e.id == id).expect("listed");
        assert_eq!(entry.next_run_at, t0 + 6000, "the first slot after the look");
        // A second firing of the same slot (another node, later) finds the
        // schedule moved on and creates nothing.
        let again = fire(&node, id, first, t0 + 5600).await;
        assert!(again.stale && again.created.is_empty());
        assert_eq!(slots(&node, id).await, expect);
    }
    // One slot due, none missed: it runs whatever catch_up says.
    let first = set_at(&node, b"on_time", r#"{"every": 1000, "catch_up": "none"}"#, t0 - 500).await;
    fire(&node, b"on_time", first, t0 + 300).await;
    assert_eq!(slots(&node, b"on_time").await, vec![t0]);
    node.stop().await;
}

async fn overlap_false_skips_a_slot_while_the_previous_run_is_active(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = Jobs::new(node.context().clone());
    let t0 = 1_900_000_000_000;
    let next = set_at(&node, b"s", r#"{"every": 1000}"#, t0 - 100).await;
    assert_eq!(fire(&node, b"s", next, t0 + 10).await.created, vec![slot_job_id(b"s", t0)]);
    let skipped = fire(&node, b"s", t0 + 1000, t0 + 1010).await;
    assert_eq!((skipped.created.len(), skipped.skipped), (0, 1), "the previous run is pending");
    jobs.remove(T, &slot_job_id(b"s", t0)).await.expect("remove");
    assert_eq!(fire(&node, b"s", t0 + 2000, t0 + 2010).await.created, vec![slot_job_id(b"s", t0 + 2000)]);
    // With overlap, every slot runs.
    let next = set_at(&node, b"o", r#"{"every": 1000, "overlap": true}"#, t0 - 100).await;
    fire(&node, b"o", next, t0 + 10).await;
    fire(&node, b"o", t0 + 1000, t0 + 1010).await;
    assert_eq!(slots(&node, b"o").await, vec![t0, t0 + 1000]);
    assert_eq!(jobs.get(T, &slot_job_id(b"o", t0)).await.expect("job").state, JobState::Pending);
    assert_eq!(jobs.get(T, &slot_job_id(b"o", t0)).await.expect("job").info, b"{}".to_vec());
    node.stop().await;
}

async fn if_leader_sets_only_while_its_epoch_leads(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let w = register(&node, b"replicator", b"w1").await;
    let (_, epoch) = Leadership::new(node.context().clone()).leader(b"replicator").await.expect("read").expect("w1");
    let fence = LeaderFence { worker_type: b"replicator".to_vec(), epoch: epoch.clone() };
    let s = schedules(&node);
    s.set(T, b"a", br#"{"every": 60000}"#, b"{}", &JobOpts::default(), Some(&fence)).await.expect("leads");
    w.unregister().await.expect("unregister");
    let stale = s.set(T, b"b", br#"{"every": 60000}"#, b"{}", &JobOpts::default(), Some(&fence)).await;
    assert_eq!(stale, Err(Error::NotLeader));
    let ids: Vec<Vec<u8>> = s.list(T).await.expect("list").into_iter().map(|e| e.id).collect();
    assert_eq!(ids, vec![b"a".to_vec()], "nothing written for a stale epoch");
    node.stop().await;
}

/// Three nodes run one schedule every second for 30 slots; one of them
/// stops (no unregister: as a killed node) and a new one starts on the
/// store mid-run. Every slot from the first to the last has exactly one
/// job (the ids are the slots: a second job of a slot cannot exist), and
/// each became pending within one second of its slot.
async fn three_nodes_one_stopped_and_started_again_fire_each_slot_once(store: StoreKind) {
    let c = Cluster::on(store);
    let nodes = [c.node(), c.node(), c.node()];
    set(&nodes[0], b"tick", r#"{"every": 1000, "overlap": true}"#).await;
    tokio::time::sleep(Duration::from_millis(10_500)).await;
    nodes[1].stop().await;
    tokio::time::sleep(Duration::from_millis(5000)).await;
    let again = c.node();
    tokio::time::sleep(Duration::from_millis(16_000)).await;
    schedules(&nodes[0]).remove(T, b"tick").await.expect("remove");
    let at = slots(&nodes[0], b"tick").await;
    assert!(at.len() >= 30, "{} slots", at.len());
    let distinct: BTreeSet<u64> = at.iter().copied().collect();
    assert_eq!(distinct.len(), at.len());
    let (first, last) = (at[0], *at.last().unwrap());
    assert_eq!(at, (0..=(last - first) / 1000).map(|k| first + k * 1000).collect::<Vec<_>>(), "no slot missed");
    let jobs = Jobs::new(nodes[0].context().clone());
    let mut late = Vec::new();
    for t in &at {
        let job = jobs.get(T, &slot_job_id(b"tick", *t)).await.expect("job");
        let queued = job.queued_at.expect("pending since");
        if queued < *t || queued - t > 1000 {
            late.push((*t, queued));
        }
    }
    assert!(late.is_empty(), "jobs not created within one second of their slot: {late:?}");
    nodes[0].stop().await;
    nodes[2].stop().await;
    again.stop().await;
}

/// The whole cluster down across several slots: with `latest`, the node
/// that starts creates one job, for the latest missed slot, at once.
async fn after_the_whole_cluster_was_down_catch_up_latest_runs_one(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    set(&node, b"s", r#"{"every": 1000}"#).await;
    node.stop().await;
    let stopped = wall_ms();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let started = wall_ms();
    let node = c.node();
    let mut at = Vec::new();
    assert!(
        eventually(Duration::from_secs(3), || {
            let n = node.clone();
            async move { !slots(&n, b"s").await.is_empty() }
        })
        .await
    );
    at.extend(slots(&node, b"s").await);
    schedules(&node).remove(T, b"s").await.expect("remove");
    // Slots after the stop and before the start were missed: one run,
    // for the latest of them.
    let missed: Vec<u64> = at.iter().copied().filter(|t| *t > stopped && *t <= started).collect();
    assert_eq!(missed.len(), 1, "one run for the missed slots: {at:?}, down from {stopped} to {started}");
    assert!(missed[0] + 1000 > started, "the latest of them: {at:?}, down from {stopped} to {started}");
    node.stop().await;
}

/// The types that have schedules are read from the schedules themselves:
/// a type scheduled before any of its jobs exist is listed (the job types
/// are not), each type once whatever its number of schedules, a type whose
/// name another's begins with too, and a type goes when its last
/// schedule is removed.
async fn job_types_lists_each_scheduled_type_once_before_any_job(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let s = schedules(&node);
    assert!(s.job_types().await.expect("types").is_empty());
    let daily = br#"{"every": 86400000}"#;
    for (job_type, id) in [(&b"b"[..], &b"1"[..]), (b"b", b"2"), (b"b", b"3"), (b"a", b"1"), (b"ab", b"1")] {
        s.set(job_type, id, daily, b"{}", &JobOpts::default(), None).await.expect("set");
    }
    assert_eq!(s.job_types().await.expect("types"), vec![b"a".to_vec(), b"ab".to_vec(), b"b".to_vec()]);
    let job_types = Jobs::new(node.context().clone()).job_types().await.expect("job types");
    assert!(job_types.is_empty(), "no slot is due yet, so no job: {job_types:?}");
    s.remove(b"a", b"1").await.expect("remove");
    assert_eq!(s.job_types().await.expect("types"), vec![b"ab".to_vec(), b"b".to_vec()]);
    node.stop().await;
}

couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread"),
    stores: [embedded: Embedded, sim: Sim],
    tests: [
        bad_specs_say_why_and_write_nothing,
        set_lists_and_remove_and_a_set_replaces_from_its_next_slot,
        catch_up_decides_what_runs_after_missed_slots,
        overlap_false_skips_a_slot_while_the_previous_run_is_active,
        if_leader_sets_only_while_its_epoch_leads,
        three_nodes_one_stopped_and_started_again_fire_each_slot_once,
        after_the_whole_cluster_was_down_catch_up_latest_runs_one,
        job_types_lists_each_scheduled_type_once_before_any_job,
    ],
);
