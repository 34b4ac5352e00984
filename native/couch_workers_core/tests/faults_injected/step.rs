//! One random operation of a scenario's task.

use super::*;

/// One random operation.
pub(crate) async fn step(node: &Arc<Node>, jobs: &JobService, world: &Mutex<World>, rng: &mut StdRng) {
    let info = format!("{{\"r\":{}}}", rng.random_range(0..1000u32)).into_bytes();
    match rng.random_range(0..100u32) {
        // Workers.
        0..=5 => {
            if lock(world).workers.len() >= 6 {
                return;
            }
            let id = fresh("w");
            let r = call("register", node.register_worker(spec(&id))).await;
            let mut w = lock(world);
            w.note("register", &r);
            if let Ok(reg) = r {
                w.workers.push((id, reg));
            }
        }
        6..=8 => {
            let taken = {
                let mut w = lock(world);
                if w.workers.len() <= 2 {
                    return;
                }
                let i = rng.random_range(0..w.workers.len());
                w.workers.swap_remove(i)
            };
            if rng.random_bool(0.3) {
                // The owner goes away: the drop removes the worker.
                drop(taken);
                return;
            }
            let r = call("unregister", node.unregister_worker(&taken.1)).await;
            lock(world).note("unregister", &r);
            // On failure the drop tries again; failing that, the reaper
            // removes the worker (its heartbeat has stopped).
        }
        // Jobs.
        9..=30 => {
            // The model learns of a job once its add has answered, so
            // that no other task removes it before it was added.
            let id = fresh("j");
            let r = call("add", jobs.add(T, &id, &info, rng.random_range(-2..=2))).await;
            let mut w = lock(world);
            w.note("add", &r);
            let m = w.jobs.entry(id).or_default();
            m.added = match &r {
                Ok(()) => Known::Yes,
                Err(Error::AlreadyExists) => Known::Yes,
                Err(_) => Known::Maybe,
            };
            if r == Err(Error::AlreadyExists) {
                w.own_write_already_exists += 1;
            }
        }
        31..=34 => {
            let batch: Vec<NewJob> =
                (0..3).map(|_| NewJob { id: fresh("m"), info: info.clone(), priority: 0 }).collect();
            let r = call("add_many", jobs.add_many(T, &batch)).await;
            let mut w = lock(world);
            w.calls += 1;
            let (name, known) = match &r {
                Ok(()) => ("ok", Known::Yes),
                Err(AddManyError::AlreadyExists(ids)) => {
                    // All or nothing: only a retry on top of its own
                    // commit can find them, and then it finds them all.
                    if ids.len() != batch.len() {
                        w.bad.push(format!("add_many: partial already_exists {ids:?}"));
                    }
                    w.own_write_already_exists += 1;
                    ("already_exists", Known::Yes)
                }
                Err(AddManyError::Error(e)) => {
                    if !acceptable(e) {
                        w.bad.push(format!("add_many: {e:?}"));
                    }
                    (e.name(), Known::Maybe)
                }
            };
            *w.outcomes.entry(name.to_string()).or_default() += 1;
            for j in &batch {
                w.jobs.entry(j.id.clone()).or_default().added = known;
            }
        }
        35..=52 => {
            let worker = {
                let w = lock(world);
                if w.workers.is_empty() {
                    return;
                }
                w.workers[rng.random_range(0..w.workers.len())].0.clone()
            };
            let wait =
                if rng.random_bool(0.3) { Duration::from_millis(rng.random_range(1..30)) } else { Duration::ZERO };
            let r = call("accept", jobs.accept(T, &worker, wait)).await;
            let mut w = lock(world);
            w.note("accept", &r);
            if let Ok(h) = r {
                w.jobs.entry(h.job.id.clone()).or_default().accepted += 1;
                w.handles.push(h);
            }
        }
        53..=64 => {
            let Some(h) = take_handle(world, rng) else { return };
            let r = call("update", jobs.update(&h.fence(), &info)).await;
            let mut w = lock(world);
            w.note("update", &r);
            match r {
                Ok(h2) => w.handles.push(h2),
                // A store failure: the handle may still hold the job.
                Err(Error::Store(_)) => w.handles.push(h),
                Err(_) => {}
            }
        }
        65..=76 => {
            let Some(h) = take_handle(world, rng) else { return };
            let r = call("finish", jobs.finish(&h.fence(), b"{\"done\":true}")).await;
            let mut w = lock(world);
            w.note("finish", &r);
            match r {
                Ok(()) => w.jobs.entry(h.job.id.clone()).or_default().finished_ok += 1,
                Err(Error::Store(_)) => w.handles.push(h),
                Err(_) => {}
            }
        }
        77..=81 => {
            let Some(id) = some_job(world, rng) else { return };
            let r = call("cancel", jobs.cancel(T, &id)).await;
            lock(world).note("cancel", &r);
        }
        82..=84 => {
            let Some(id) = some_job(world, rng) else { return };
            let r = call("remove", jobs.remove(T, &id)).await;
            let mut w = lock(world);
            w.note("remove", &r);
            let m = w.jobs.get_mut(&id).expect("model");
            match r {
                // `not_found` for a job known to exist: this remove's own
                // earlier attempt (commit-unknown) or an earlier failed one.
                Ok(()) | Err(Error::NotFound) => m.removed = Known::Yes,
                Err(_) => {
                    if m.removed == Known::No {
                        m.removed = Known::Maybe;
                    }
                }
            }
        }
        85..=90 => {
            let Some(id) = some_job(world, rng) else { return };
            let r = call("get", jobs.get(T, &id)).await;
            lock(world).note("get", &r);
            let r = call("pending_count", jobs.pending_count(T)).await;
            lock(world).note("pending_count", &r);
        }
        91..=94 => {
            let mut w = lock(world);
            if w.watches.len() < 4 && rng.random_bool(0.6) {
                match node.watch_membership(T.to_vec(), Box::new(|_| {})) {
                    Ok(watch) => w.watches.push(watch),
                    Err(e) => w.bad.push(format!("watch_membership: {e:?}")),
                }
            } else if !w.watches.is_empty() {
                let i = rng.random_range(0..w.watches.len());
                drop(w.watches.swap_remove(i));
            }
        }
        _ => {
            let Some(id) = some_job(world, rng) else { return };
            if rng.random_bool(0.5) || lock(world).subscriptions.len() >= 4 {
                let mut w = lock(world);
                if !w.subscriptions.is_empty() {
                    let i = rng.random_range(0..w.subscriptions.len());
                    drop(w.subscriptions.swap_remove(i));
                }
                return;
            }
            let r = call("subscribe", jobs.subscribe(T, &id, Box::new(|_| {}))).await;
            let mut w = lock(world);
            w.note("subscribe", &r.as_ref().map(|_| ()).map_err(Clone::clone));
            if let Ok((_, sub)) = r {
                w.subscriptions.push(sub);
            }
        }
    }
}
