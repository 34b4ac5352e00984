//! `couch-workers`: the operators' command line (docs/api.md, "Operations").
//!
//! It opens the store itself (the core's `Context`), needs no node, and
//! starts no task: no reaper, no heartbeat, no dispatcher, no sweeper, no
//! pruner (a test below counts the context's spawns). It is safe beside
//! running nodes: reads are snapshot reads in read-only transactions (they
//! conflict with nobody). Its only writes are the actions asked for
//! (`cancel`, `remove`, `retry`, `pause`, `resume`, `schedule-remove`, `type` with a change), each one ordinary
//! transaction of the stateless job API (`Jobs`), the same that a node's
//! `job_cancel/2`, `job_remove/2`, `job_resubmit/4`, `job_pause/1` and
//! `job_resume/1` run, so running nodes see them as they see each other's
//! (a pause stops their acceptors, a resume wakes them).
//!
//! Tables for people, one JSON object per line with `--json`; exit status
//! 0 on success, 1 with a one-line reason on stderr otherwise.

mod args;
mod output;
mod type_args;

use std::process::ExitCode;
use std::sync::Arc;

use couch_workers_core::leaders::Leadership;
use couch_workers_core::recurring::Schedules;
use couch_workers_core::{Context, Error, JobOpts, JobState, Jobs, StoreConfig};

use args::{Command, Options, Page, Store};
use output::Out;

fn main() -> ExitCode {
    let opts = match args::parse(std::env::args_os().skip(1).collect()) {
        Ok(o) => o,
        Err(why) if why.is_empty() => {
            print!("{}", args::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(why) => {
            eprintln!("couch-workers: {why}");
            eprint!("{}", args::USAGE);
            return ExitCode::FAILURE;
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("couch-workers: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = Out::new(opts.json);
    match rt.block_on(execute(&opts, &mut out)) {
        Ok(()) => {
            out.flush();
            ExitCode::SUCCESS
        }
        Err(why) => {
            out.flush();
            eprintln!("couch-workers: {why}");
            ExitCode::FAILURE
        }
    }
}

fn show(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn open(store: &Store) -> Result<Arc<Context>, String> {
    let config = match store {
        Store::Embedded(dir) => {
            // Opening would create an empty store: a mistyped path must be
            // an error, not a new store.
            let file = dir.join("couch_workers.sqlite");
            if !file.is_file() {
                return Err(format!("no store at {} (no couch_workers.sqlite there)", dir.display()));
            }
            StoreConfig::embedded(dir)
        }
        Store::Fdb(cluster_file) => {
            if !cluster_file.is_file() {
                return Err(format!("no cluster file at {}", cluster_file.display()));
            }
            StoreConfig::Fdb { cluster_file: cluster_file.clone() }
        }
        Store::FdbTest(name, cluster_file) => {
            if !cluster_file.is_file() {
                return Err(format!("no cluster file at {}", cluster_file.display()));
            }
            // Another process's test store: never removed from here.
            StoreConfig::FdbTest { cluster_file: cluster_file.clone(), name: name.clone(), owner: false }
        }
    };
    Context::open(&config).await.map_err(|e| format!("cannot open the store: {e}"))
}

/// A store error as the command line reports it.
fn store_error(e: Error) -> String {
    format!("store error: {e}")
}

async fn execute(opts: &Options, out: &mut Out) -> Result<(), String> {
    let ctx = open(&opts.store).await?;
    let result = command(&opts.command, &ctx, out).await;
    ctx.close();
    result
}

async fn command(cmd: &Command, ctx: &Arc<Context>, out: &mut Out) -> Result<(), String> {
    let jobs_api = Jobs::new(ctx.clone());
    match cmd {
        Command::Status => status(ctx, &jobs_api, out).await,
        Command::Workers(only) => {
            let types = match only {
                Some(t) => vec![t.clone()],
                None => ctx.worker_types().await.map_err(store_error)?,
            };
            out.workers_header();
            for t in &types {
                let t = t.as_slice();
                let ws = ctx.workers(t).await.map_err(store_error)?;
                if ws.is_empty() && only.is_some() {
                    return Err(format!("no registered workers of type {:?}", show(t)));
                }
                let leader = leader(ctx, t).await?;
                for w in &ws {
                    out.worker(t, w, leader.as_deref() == Some(w.id.as_slice()));
                }
            }
            Ok(())
        }
        Command::Jobs { job_type, states, limit, page } => jobs(&jobs_api, out, job_type, states, *limit, page).await,
        Command::Job(t, id) => {
            let service = &jobs_api;
            let (job, runs) = service.get_with_history(t, id).await.map_err(|e| job_error(&e, t, id))?;
            out.jobs_header();
            out.job_with_history(&job, &runs);
            Ok(())
        }
        Command::Cancel(t, id) => {
            let service = &jobs_api;
            service.cancel(t, id).await.map_err(|e| job_error(&e, t, id))?;
            let job = service.get(t, id).await.map_err(|e| job_error(&e, t, id))?;
            out.done("canceled", &job);
            Ok(())
        }
        Command::Remove(t, id) => {
            let service = &jobs_api;
            service.remove(t, id).await.map_err(|e| job_error(&e, t, id))?;
            out.removed(t, id);
            Ok(())
        }
        Command::Retry(t, id) => {
            let service = &jobs_api;
            let job = service.get(t, id).await.map_err(|e| job_error(&e, t, id))?;
            if job.state != JobState::Failed {
                return Err(format!(
                    "job {:?} of type {:?} is {}, not failed: only a failed job is retried",
                    show(id),
                    show(t),
                    job.state.name()
                ));
            }
            // `job_resubmit/4` with the job's own info and options, only if
            // it is still the failed job read above: pending again, attempts
            // 0, no error.
            service.resubmit(t, id, &job.info, &JobOpts::default(), Some(&job.vs)).await.map_err(|e| {
                match e.name() {
                    "changed" => format!(
                        "job {:?} of type {:?} changed meanwhile: nothing done (look at it again)",
                        show(id),
                        show(t)
                    ),
                    _ => job_error(&e, t, id),
                }
            })?;
            let job = service.get(t, id).await.map_err(|e| job_error(&e, t, id))?;
            out.done("retried", &job);
            Ok(())
        }
        Command::Schedules(t) => {
            let list = Schedules::new(ctx.clone()).list(t).await.map_err(store_error)?;
            out.schedules_header();
            for e in &list {
                out.schedule(t, e);
            }
            Ok(())
        }
        Command::ScheduleRemove(t, id) => {
            Schedules::new(ctx.clone()).remove(t, id).await.map_err(|e| match e.name() {
                "not_found" => format!("no schedule {:?} of type {:?}", show(id), show(t)),
                "key_too_large" => "the type or id is over the key limit".into(),
                _ => format!("store error: {e}"),
            })?;
            out.schedule_removed(t, id);
            Ok(())
        }
        Command::Pause(t) | Command::Resume(t) => {
            let pause = matches!(cmd, Command::Pause(_));
            let paused = ctx.job_paused(t).await.map_err(store_error)?;
            // A type nobody knows is most likely a typo: refuse it.
            if !paused && total_jobs(&jobs_api, t).await? == 0 && ctx.workers(t).await.map_err(store_error)?.is_empty()
            {
                return Err(format!("no jobs or workers of type {:?}", show(t)));
            }
            jobs_api.set_paused(t, pause).await.map_err(|e| match e.name() {
                "key_too_large" => "the type is over the key limit".to_string(),
                _ => format!("store error: {e}"),
            })?;
            out.paused(t, pause, paused);
            Ok(())
        }
        Command::Type(t, changes) => {
            let settings = if changes.is_empty() {
                jobs_api.type_settings(t).await
            } else {
                jobs_api.set_type_settings(t, changes).await
            };
            let settings = settings.map_err(store_error)?;
            let running = jobs_api.counts(t).await.map_err(store_error)?;
            let running = running.iter().find(|(state, _)| *state == JobState::Running).map_or(0, |(_, n)| *n);
            out.type_settings(t, running, &settings);
            Ok(())
        }
    }
}

/// The `jobs` command: one page, or every page (`--all`), each page one
/// read transaction (as `job_list/2` pages: a job that does not change
/// meanwhile is printed once, and none is skipped).
async fn jobs(api: &Jobs, out: &mut Out, t: &[u8], states: &[String], limit: usize, page: &Page) -> Result<(), String> {
    // Through each state's index: a page costs its own jobs, not the
    // type's jobs in other states.
    let states: Vec<JobState> = states.iter().filter_map(|s| JobState::from_name(s.as_bytes())).collect();
    let only = (!states.is_empty()).then_some(states.as_slice());
    let mut after: Option<Vec<u8>> = match page {
        Page::After(id) => Some(id.clone()),
        Page::First | Page::All => None,
    };
    out.jobs_header();
    let mut first = true;
    loop {
        let from = after.as_deref();
        let (jobs, cont) = api.list(t, only, limit, from).await.map_err(store_error)?;
        // Only a first page can tell that the type has no jobs at all.
        if first && from.is_none() && jobs.is_empty() && cont.is_none() && total_jobs(api, t).await? == 0 {
            return Err(format!("no jobs of type {:?}", show(t)));
        }
        first = false;
        for j in &jobs {
            out.job(j);
        }
        match cont {
            Some(last) if *page == Page::All => after = Some(last),
            Some(last) => {
                out.next_page(&args::cursor(&last));
                return Ok(());
            }
            None => return Ok(()),
        }
    }
}

/// Every job of the type, in any state (its counters).
async fn total_jobs(api: &Jobs, t: &[u8]) -> Result<u64, String> {
    Ok(api.counts(t).await.map_err(store_error)?.iter().map(|(_, n)| n).sum())
}

fn job_error(e: &Error, t: &[u8], id: &[u8]) -> String {
    match e.name() {
        "not_found" => format!("no job {:?} of type {:?}", show(id), show(t)),
        "key_too_large" => "the type or id is over the key limit".into(),
        _ => format!("store error: {e}"),
    }
}

/// The id of the type's leader (its oldest registration), if it has one.
async fn leader(ctx: &Arc<Context>, t: &[u8]) -> Result<Option<Vec<u8>>, String> {
    Ok(Leadership::new(ctx.clone()).leader(t).await.map_err(store_error)?.map(|(id, _epoch)| id))
}

async fn status(ctx: &Arc<Context>, api: &Jobs, out: &mut Out) -> Result<(), String> {
    let types = ctx.worker_types().await.map_err(store_error)?;
    out.status_workers_header();
    for t in &types {
        let ws = ctx.workers(t).await.map_err(store_error)?;
        let leader = leader(ctx, t).await?;
        out.status_workers(t, &ws, leader.as_deref());
    }
    let job_types = api.job_types().await.map_err(store_error)?;
    out.status_jobs_header();
    for t in &job_types {
        let counts = api.counts(t).await.map_err(store_error)?;
        let paused = ctx.job_paused(t).await.map_err(store_error)?;
        out.status_jobs(t, &counts, paused);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cancel` writes the cancellation and starts no task: the command
    /// line runs no services. (Before the context, it started the job
    /// service, whose sweeper, pruner and promoter were 3 tasks alive
    /// after the command.)
    #[test]
    fn cancel_starts_no_task() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let ctx = Context::open(&StoreConfig::embedded(dir.path())).await.unwrap();
            Jobs::new(ctx.clone()).add(b"t", b"j", b"{}", 0).await.unwrap();
            let before = tokio::runtime::Handle::current().metrics().num_alive_tasks();
            let mut out = Out::new(true);
            command(&Command::Cancel(b"t".to_vec(), b"j".to_vec()), &ctx, &mut out).await.unwrap();
            assert_eq!(Jobs::new(ctx.clone()).get(b"t", b"j").await.unwrap().state, JobState::Canceled);
            assert_eq!(ctx.spawned(), 0, "tasks spawned through the context");
            let alive = tokio::runtime::Handle::current().metrics().num_alive_tasks();
            assert_eq!(alive, before, "tasks alive after cancel");
            ctx.close();
        });
    }
}
