//! Running limits of a job type (`max_running`, `max_running_per_group`),
//! enforced by the accept round on the exact running counters: never more
//! at any instant (read by a sampler in its own transactions), a full
//! group passed over in queue order, slots freed by a run's end and by
//! failover in their own transactions, a raised limit and a run's end on
//! another node waking waiting acceptors at once (the end-to-accept
//! latency printed), a lowered one stopping nothing. On every store.
//! (The groups' counters' sweep: `tests/jobs_group_counters.rs`.)

mod jobs_common;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::collections::HashMap;

use couch_workers_core::jobs::ops;
use couch_workers_core::jobs::{JobHandle, JobOpts, JobSpec, JobState, NextFor, TypeSetting};
use couch_workers_core::keyspace::Incarnation;
use couch_workers_core::store::{run, RangeRequest, StoreError, TxOptions};
use couch_workers_core::workers;
use couch_workers_core::{roster, Error, Node};
use jobs_common::*;

const T: &[u8] = b"limited";

async fn set_max(node: &Node, n: Option<u64>) {
    node.jobs().set_type_settings(T, &[TypeSetting::MaxRunning(n)]).await.expect("set max_running");
}

fn counter(raw: Option<Vec<u8>>) -> i64 {
    let mut le = [0u8; 8];
    if let Some(raw) = raw {
        le[..raw.len().min(8)].copy_from_slice(&raw[..raw.len().min(8)]);
    }
    i64::from_le_bytes(le)
}

/// The type's running counter and the size of its `running` index, read
/// in one transaction of their own.
async fn running_now(node: &Node) -> (i64, usize) {
    let ks = node.keyspace();
    run(node.db().as_ref(), TxOptions::read(), |tx| async move {
        let count = tx.get(&ks.state_count(T, b"running"), false).await?;
        let (b, e) = ks.by_state_range(T, b"running");
        let index = tx.get_range(&RangeRequest::new(b, e)).await?;
        Ok((counter(count), index.len()))
    })
    .await
    .expect("read the running counter")
}

/// Samples [`running_now`] until `stop`; returns the most seen, and
/// fails on a sample over `limit` or a counter that disagrees with the
/// index.
fn sampler(node: Arc<Node>, limit: i64, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<(i64, usize)> {
    tokio::spawn(async move {
        let (mut most, mut samples) = (0, 0);
        while !stop.load(Ordering::SeqCst) {
            let (count, index) = running_now(&node).await;
            assert!(count <= limit, "{count} running over the limit {limit}");
            assert_eq!(count, index as i64, "the counter is the index's size");
            most = most.max(count);
            samples += 1;
            tokio::task::yield_now().await;
        }
        (most, samples)
    })
}

/// 4 workers on each of two nodes (half of them finishing with
/// `finish_accept`) run 40 jobs under `max_running` 3: a sampler never
/// sees more than 3 running, sees 3, and every job finishes.
async fn max_running_holds_at_every_instant_across_two_nodes(store: StoreKind) {
    const JOBS: usize = 40;
    const LIMIT: u64 = 3;
    let c = Cluster::on(store);
    let (a, b) = (c.node(), c.node());
    set_max(&a, Some(LIMIT)).await;
    for i in 0..JOBS {
        add(a.jobs(), T, format!("j{i:03}").as_bytes(), 0).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let sampling = sampler(a.clone(), LIMIT as i64, stop.clone());
    let done = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for (n, node) in [&a, &b].into_iter().enumerate() {
        for w in 0..4 {
            let (node, done) = (node.clone(), done.clone());
            let worker = format!("w{n}{w}").into_bytes();
            let reg = register(&node, T, &worker).await;
            workers.push(tokio::spawn(async move {
                let _reg = reg;
                let jobs = node.jobs();
                let mut held: Option<JobHandle> = None;
                while done.load(Ordering::SeqCst) < JOBS {
                    let h = match held.take() {
                        Some(h) => h,
                        None => match jobs.accept(T, &worker, Duration::from_millis(300)).await {
                            Ok(h) => h,
                            Err(Error::NotFound) => continue,
                            Err(e) => panic!("accept: {e:?}"),
                        },
                    };
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    if w % 2 == 0 {
                        let next = NextFor { worker_type: T, worker: &worker, incarnation: None };
                        held = jobs.finish_accept(&h.fence(), b"{}", next).await.expect("finish_accept");
                    } else {
                        jobs.finish(&h.fence(), b"{}").await.expect("finish");
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                }
                assert!(held.is_none(), "a job taken after the last one finished");
            }));
        }
    }
    for w in workers {
        tokio::time::timeout(Duration::from_secs(60), w).await.expect("the jobs finish").unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let (most, samples) = sampling.await.unwrap();
    println!("{store:?}: most running seen {most} in {samples} samples (limit {LIMIT})");
    assert_eq!(most, LIMIT as i64, "the limit was reached");
    let counts = a.jobs().counts(T).await.unwrap();
    assert!(counts.contains(&(JobState::Finished, JOBS as u64)), "{counts:?}");
    assert_eq!(running_now(&a).await, (0, 0));
    a.stop().await;
    b.stop().await;
}

/// A reaped worker's runs free their slots in the failover's
/// transaction: after a removal the counter is back at once, and a
/// worker waiting on another node takes the job the reaper requeued.
async fn failover_frees_the_slots_of_a_dead_workers_runs(store: StoreKind) {
    const INC: Incarnation = [7; 16];
    let c = Cluster::on(store);
    let (node, other) = (c.node(), c.node());
    let ks = node.keyspace().clone();
    set_max(&node, Some(1)).await;
    for id in [b"x", b"y"] {
        add(node.jobs(), T, id, 0).await;
    }
    // roster::remove in a transaction of its own (what a reap does).
    let w = register(&node, T, b"w").await;
    let hx = accept_now(node.jobs(), T, b"w").await;
    assert_eq!(node.jobs().accept(T, b"w", Duration::ZERO).await.map(|h| h.job.id), Err(Error::NotFound), "full");
    assert_eq!(running_now(&node).await, (1, 1));
    let (k, inc) = (&ks, w.incarnation());
    let removed =
        run(node.db().as_ref(), TxOptions::write(), |tx| async move { roster::remove(&tx, k, T, b"w", inc).await })
            .await
            .unwrap();
    assert!(removed);
    assert_eq!(running_now(&node).await, (0, 0), "the failover's transaction freed the slot");
    assert_eq!(get(node.jobs(), T, &hx.job.id).await.state, JobState::Pending);

    // A worker whose heartbeats stop (timeout 1 s, no heartbeat task)
    // holds the one slot; a worker on the other node waits for it and is
    // served when the reaper requeues the dead worker's job.
    let short = workers::WorkerSpec { timeout_s: 1, ..spec(T, b"silent") };
    let s = &short;
    run(node.db().as_ref(), TxOptions::write(), |tx| async move { roster::register(&tx, k, s, &INC, 0).await })
        .await
        .unwrap();
    let silent = accept_now(node.jobs(), T, b"silent").await;
    let _v = register(&other, T, b"v").await;
    let waiting = other.jobs().accept(T, b"v", Duration::from_secs(20));
    let got = tokio::time::timeout(Duration::from_secs(20), waiting).await.expect("served").expect("a job");
    assert_eq!(get(node.jobs(), T, &silent.job.id).await.state, JobState::Pending, "requeued by the reaper");
    assert_ne!(got.job.id, silent.job.id, "the job that waited longest comes first");
    assert_eq!(running_now(&node).await, (1, 1));
    assert_eq!(node.jobs().finish(&silent.fence(), b"{}").await, Err(Error::NotOwner));
    node.stop().await;
    other.stop().await;
}

/// Raising the limit serves a waiting acceptor at once (the change wakes
/// every dispatcher; without it the acceptor would wait out its
/// timeout); lowering it stops no run, and new accepts wait until the
/// runs are under the new limit.
async fn raising_wakes_waiters_and_lowering_stops_nothing(store: StoreKind) {
    let c = Cluster::on(store);
    let (a, b) = (c.node(), c.node());
    set_max(&a, Some(1)).await;
    for i in 0..4 {
        add(a.jobs(), T, format!("j{i}").as_bytes(), 0).await;
    }
    let _ra = register(&a, T, b"wa").await;
    let _rb = register(&b, T, b"wb").await;
    let _rc = register(&b, T, b"wc").await;
    let ha = accept_now(a.jobs(), T, b"wa").await;
    let jb = b.clone();
    let waiting = tokio::spawn(async move {
        let got = jb.jobs().accept(T, b"wb", Duration::from_secs(10)).await;
        (got, Instant::now())
    });
    assert!(eventually(Duration::from_secs(5), || async { b.jobs().stats().waiters == 1 }).await);
    // Its round has run and found the type full (nothing taken).
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "a full type serves nobody");
    assert_eq!(running_now(&a).await, (1, 1));

    let raised = Instant::now();
    set_max(&a, Some(2)).await;
    let (got, at) = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("served").unwrap();
    let hb = got.expect("a job once the limit is raised");
    println!("{store:?}: limit raised to accept served: {:?}", at.duration_since(raised));
    assert_eq!(running_now(&a).await, (2, 2));

    // Lowered to 1 with 2 running: both runs go on.
    set_max(&a, Some(1)).await;
    a.jobs().update(&ha.fence(), b"{\"still\":1}").await.expect("a run goes on");
    b.jobs().update(&hb.fence(), b"{\"still\":1}").await.expect("b run goes on");
    let jc = b.clone();
    let third = tokio::spawn(async move { jc.jobs().accept(T, b"wc", Duration::from_secs(10)).await });
    assert!(eventually(Duration::from_secs(5), || async { b.jobs().stats().waiters == 1 }).await);
    a.jobs().finish(&ha.fence(), b"{}").await.unwrap();
    // One run left, the limit 1: still full.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!third.is_finished(), "one running at limit 1 serves nobody");
    assert_eq!(running_now(&a).await, (1, 1));
    b.jobs().finish(&hb.fence(), b"{}").await.unwrap();
    let hc = tokio::time::timeout(Duration::from_secs(5), third).await.expect("served").unwrap().expect("a job");
    assert_eq!(running_now(&a).await, (1, 1));
    b.jobs().finish(&hc.fence(), b"{}").await.unwrap();
    a.stop().await;
    b.stop().await;
}

async fn add_in(node: &Node, id: &str, group: Option<&str>, priority: i64) {
    let opts = JobOpts { priority: Some(priority), group: group.map(|g| g.as_bytes().to_vec()), ..JobOpts::default() };
    node.jobs().add_with(T, id.as_bytes(), &info(0), &opts).await.expect("add");
}

/// Per group: its running counter and its running records, read in one
/// transaction of their own.
async fn running_by_group(node: &Node, groups: &[&str]) -> HashMap<String, (i64, usize)> {
    let ks = node.keyspace();
    run(node.db().as_ref(), TxOptions::read(), |tx| async move {
        let (b, e) = ks.by_state_range(T, b"running");
        let mut out: HashMap<String, (i64, usize)> = HashMap::new();
        for g in groups {
            let count = counter(tx.get(&ks.group_running(T, g.as_bytes()), false).await?);
            out.insert(g.to_string(), (count, 0));
        }
        for (key, _) in tx.get_range(&RangeRequest::new(b, e)).await? {
            let id = ks.parse_by_state(T, b"running", &key).expect("an index key");
            let job = ops::get(&tx, ks, T, &id).await?.expect("its record");
            if let Some(g) = job.group {
                out.entry(String::from_utf8(g).unwrap()).or_default().1 += 1;
            }
        }
        Ok(out)
    })
    .await
    .expect("read the group counters")
}

/// Under `max_running_per_group` 2: a full group's jobs are passed over
/// and the next jobs of groups with room are taken in queue order
/// (priority, then first in first out), a job without a group by the
/// type's limit alone; then 6 workers on two nodes drain 60 jobs of 3
/// groups, and a sampler never sees a group over 2 (counter and records
/// agreeing).
async fn a_full_group_is_passed_over_and_the_group_limit_holds(store: StoreKind) {
    let c = Cluster::on(store);
    let (a, b) = (c.node(), c.node());
    a.jobs().set_type_settings(T, &[TypeSetting::MaxRunningPerGroup(Some(2))]).await.unwrap();
    for i in 1..=5 {
        add_in(&a, &format!("a{i}"), Some("A"), 0).await;
    }
    add_in(&a, "b1", Some("B"), 0).await;
    add_in(&a, "n1", None, 0).await;
    add_in(&a, "b2", Some("B"), 0).await;
    add_in(&a, "b3", Some("B"), 0).await;
    add_in(&a, "c1", Some("C"), 1).await;
    // A pending key's value names the job's group (`""`: none), so that a
    // full group's jobs are passed over without reading their records.
    let values: Vec<Vec<u8>> = range(&a, ks(&a).pending_range(T)).await.into_iter().map(|(_, v)| v).collect();
    assert_eq!(values[0], b"\x01A\x00");
    assert_eq!(values[6], b"");
    let _w = register(&a, T, b"w").await;
    let mut held = HashMap::new();
    let mut order = Vec::new();
    loop {
        match a.jobs().accept(T, b"w", Duration::ZERO).await {
            Ok(h) => {
                order.push(String::from_utf8(h.job.id.clone()).unwrap());
                held.insert(h.job.id.clone(), h);
            }
            Err(Error::NotFound) => break,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(order, ["a1", "a2", "b1", "n1", "b2", "c1"], "A and B full, C's one job taken after priority 0");
    // A slot of A frees: the next of A, first in first out; a new job of
    // A with an earlier priority comes before the rest of A.
    add_in(&a, "a0", Some("A"), -1).await;
    a.jobs().finish(&held[&b"a1".to_vec()].fence(), b"{}").await.unwrap();
    assert_eq!(accept_now(a.jobs(), T, b"w").await.job.id, b"a0");
    a.jobs().finish(&held[&b"b1".to_vec()].fence(), b"{}").await.unwrap();
    assert_eq!(accept_now(a.jobs(), T, b"w").await.job.id, b"b3", "B has room again");
    assert_eq!(a.jobs().accept(T, b"w", Duration::ZERO).await.map(|h| h.job.id), Err(Error::NotFound));
    let now = running_by_group(&a, &["A", "B", "C"]).await;
    assert_eq!((now["A"], now["B"], now["C"]), ((2, 2), (2, 2), (1, 1)));
    a.jobs().remove(T, b"a2").await.unwrap();
    assert_eq!(running_by_group(&a, &["A"]).await["A"], (1, 1), "a removal frees the group's slot");
    assert_eq!(accept_now(a.jobs(), T, b"w").await.job.id, b"a3");
    drop(_w);
    // Unregistered: its runs go back (failover) and free every slot.
    a.unregister_worker(&register(&a, T, b"w").await).await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            running_by_group(&a, &["A", "B", "C"]).await.values().all(|v| *v == (0, 0))
        })
        .await
    );
    a.jobs().set_type_settings(T, &[TypeSetting::MaxRunningPerGroup(None)]).await.unwrap();
    for id in [b"a0".as_slice(), b"a3", b"a4", b"a5", b"b1", b"b2", b"b3", b"c1", b"n1"] {
        let _ = a.jobs().remove(T, id).await;
    }

    // The drain: 60 jobs of 3 groups (20 each, interleaved), 6 workers on
    // two nodes waiting for jobs, the sampler watching each group.
    a.jobs().set_type_settings(T, &[TypeSetting::MaxRunningPerGroup(Some(2))]).await.unwrap();
    const JOBS: usize = 60;
    for i in 0..JOBS {
        add_in(&a, &format!("d{i:03}"), Some(["X", "Y", "Z"][i % 3]), 0).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (sa, sstop) = (a.clone(), stop.clone());
    let sampling = tokio::spawn(async move {
        let (mut most, mut samples) = (0, 0);
        while !sstop.load(Ordering::SeqCst) {
            for (g, (count, records)) in running_by_group(&sa, &["X", "Y", "Z"]).await {
                assert!(count <= 2, "group {g}: {count} running");
                assert_eq!(count, records as i64, "group {g}: the counter is its running records");
                most = most.max(count);
            }
            samples += 1;
            // The sim store's reads may never return Pending: without a
            // yield this loop could keep its worker thread from the tasks
            // queued behind it (the drain's workers), and the test hung.
            tokio::task::yield_now().await;
        }
        (most, samples)
    });
    let done = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for (n, node) in [&a, &b].into_iter().enumerate() {
        for w in 0..3 {
            let (node, done) = (node.clone(), done.clone());
            let worker = format!("g{n}{w}").into_bytes();
            let reg = register(&node, T, &worker).await;
            workers.push(tokio::spawn(async move {
                let _reg = reg;
                let jobs = node.jobs();
                while done.load(Ordering::SeqCst) < JOBS {
                    let h = match jobs.accept(T, &worker, Duration::from_millis(300)).await {
                        Ok(h) => h,
                        Err(Error::NotFound) => continue,
                        Err(e) => panic!("accept: {e:?}"),
                    };
                    // Long enough for runs to overlap where an accept takes
                    // a few ms (FoundationDB).
                    tokio::time::sleep(Duration::from_millis(15)).await;
                    jobs.finish(&h.fence(), b"{}").await.expect("finish");
                    done.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
    }
    for w in workers {
        tokio::time::timeout(Duration::from_secs(60), w).await.expect("the jobs finish").unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let (most, samples) = sampling.await.unwrap();
    println!("{store:?}: most running in one group {most} in {samples} samples (limit 2)");
    assert_eq!(most, 2, "a group reached its limit");
    a.stop().await;
    b.stop().await;
}

/// A group too long for its group's running counter (the counter's key
/// would be over the store's key limit) is refused where a job is added
/// or queued again, `key_too_large` and nothing written, with or without
/// a per-group limit; the queue goes on. (Such a job was added before,
/// and could never start.)
async fn a_group_too_long_for_its_counter_is_refused_at_add(store: StoreKind) {
    let c = Cluster::on(store);
    let node = c.node();
    let jobs = node.jobs();
    let long = JobOpts { group: Some(vec![b'g'; 9_990]), ..JobOpts::default() };
    let too_large = |r: Result<(), Error>| matches!(r, Err(Error::Store(StoreError::KeyTooLarge)));
    let _w = register(&node, T, b"w").await;
    for limit in [None, Some(1)] {
        jobs.set_type_settings(T, &[TypeSetting::MaxRunningPerGroup(limit)]).await.unwrap();
        let (bad, good) = (format!("long{limit:?}"), format!("short{limit:?}"));
        assert!(too_large(jobs.add_with(T, bad.as_bytes(), &info(0), &long).await), "limit {limit:?}");
        let specs = [
            JobSpec { id: b"other".to_vec(), info: info(0), opts: JobOpts::default() },
            JobSpec { id: bad.clone().into_bytes(), info: info(0), opts: long.clone() },
        ];
        assert!(jobs.add_many_with(T, &specs).await.is_err(), "add_many: all or nothing");
        add_in(&node, &good, Some("g"), 0).await;
        assert!(too_large(jobs.resubmit(T, good.as_bytes(), &info(1), &long, None).await));
        assert!(too_large(jobs.resubmit(T, bad.as_bytes(), &info(1), &long, None).await));
        for id in [bad.as_bytes(), b"other"] {
            assert!(matches!(jobs.get(T, id).await, Err(Error::NotFound)), "nothing written");
        }
        let h = accept_now(jobs, T, b"w").await;
        assert_eq!((h.job.id.as_slice(), h.job.group.as_deref()), (good.as_bytes(), Some(&b"g"[..])));
        jobs.finish(&h.fence(), b"{}").await.unwrap();
    }
    node.stop().await;
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Under `max_running` 1, the run's end on one node serves the acceptor
/// waiting on the other (pushed by the running counter's watch, no
/// poll), 200 times, alternating; prints the end-to-accept latency.
async fn a_run_end_serves_a_waiter_on_another_node(store: StoreKind) {
    const RUNS: usize = 200;
    let c = Cluster::on(store);
    let nodes = [c.node(), c.node()];
    set_max(&nodes[0], Some(1)).await;
    let ids: Vec<Vec<u8>> = (0..=RUNS).map(|i| format!("j{i:04}").into_bytes()).collect();
    for id in &ids {
        add(nodes[0].jobs(), T, id, 0).await;
    }
    let _r0 = register(&nodes[0], T, b"w0").await;
    let _r1 = register(&nodes[1], T, b"w1").await;
    let workers: [&[u8]; 2] = [b"w0", b"w1"];
    let mut held = accept_now(nodes[0].jobs(), T, b"w0").await;
    let (mut from_call, mut from_commit) = (Vec::new(), Vec::new());
    let early = Arc::new(AtomicU64::new(0));
    for i in 0..RUNS {
        let (holder, waiter) = (i % 2, (i + 1) % 2);
        let node = nodes[waiter].clone();
        let worker = workers[waiter];
        let waiting = tokio::spawn(async move {
            let got = node.jobs().accept(T, worker, Duration::from_secs(10)).await;
            (got, Instant::now())
        });
        let jobs = nodes[waiter].jobs();
        assert!(eventually(Duration::from_secs(5), || async { jobs.stats().waiters == 1 }).await);
        // Let its round find the type full and arm its watches.
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(!waiting.is_finished(), "run {i}: served while the type was full");
        let called = Instant::now();
        nodes[holder].jobs().finish(&held.fence(), b"{}").await.unwrap();
        let committed = Instant::now();
        let (got, at) = waiting.await.unwrap();
        held = got.unwrap_or_else(|e| panic!("run {i}: {e:?}"));
        from_call.push(at.duration_since(called));
        if at < committed {
            early.fetch_add(1, Ordering::Relaxed);
        }
        from_commit.push(at.saturating_duration_since(committed));
    }
    from_call.sort();
    from_commit.sort();
    println!(
        "{store:?}: run end to accept on another node over {RUNS} runs: from the finish call p50 {:?} p99 {:?} max {:?}; \
         from its commit p50 {:?} p99 {:?} ({} served before the finish call returned)",
        percentile(&from_call, 0.5),
        percentile(&from_call, 0.99),
        from_call[RUNS - 1],
        percentile(&from_commit, 0.5),
        percentile(&from_commit, 0.99),
        early.load(Ordering::Relaxed),
    );
    nodes[RUNS % 2].jobs().finish(&held.fence(), b"{}").await.unwrap();
    assert_eq!(running_now(&nodes[0]).await, (0, 0));

    // For comparison, the push that needs no limit: a job added on one
    // node to the acceptor waiting (on an empty queue) on the other.
    const PUSHES: usize = 100;
    let mut from_add = Vec::new();
    for i in 0..PUSHES {
        let (adder, waiter) = (i % 2, (i + 1) % 2);
        let node = nodes[waiter].clone();
        let worker = workers[waiter];
        let waiting = tokio::spawn(async move {
            let got = node.jobs().accept(T, worker, Duration::from_secs(10)).await;
            (got, Instant::now())
        });
        let jobs = nodes[waiter].jobs();
        assert!(eventually(Duration::from_secs(5), || async { jobs.stats().waiters == 1 }).await);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let committed = {
            add(nodes[adder].jobs(), T, format!("p{i:04}").as_bytes(), 0).await;
            Instant::now()
        };
        let (got, at) = waiting.await.unwrap();
        let h = got.unwrap_or_else(|e| panic!("push {i}: {e:?}"));
        from_add.push(at.saturating_duration_since(committed));
        nodes[waiter].jobs().finish(&h.fence(), b"{}").await.unwrap();
    }
    from_add.sort();
    println!(
        "{store:?}: for comparison, an added job to the accept waiting on another node over {PUSHES} runs: \
         from the add's commit p50 {:?} p99 {:?}",
        percentile(&from_add, 0.5),
        percentile(&from_add, 0.99),
    );
    for n in nodes {
        n.stop().await;
    }
}

couch_workers_core::store_tests!(
    runtime: (flavor = "multi_thread", worker_threads = 4),
    stores: [embedded: Embedded, sim: Sim],
    tests: [
        max_running_holds_at_every_instant_across_two_nodes,
        failover_frees_the_slots_of_a_dead_workers_runs,
        raising_wakes_waiters_and_lowering_stops_nothing,
        a_run_end_serves_a_waiter_on_another_node,
        a_full_group_is_passed_over_and_the_group_limit_holds,
        a_group_too_long_for_its_counter_is_refused_at_add,
    ],
);
