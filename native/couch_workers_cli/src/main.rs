//! `couch-workers`: the operators' command line (docs/api.md, "Operations").
//!
//! It opens the store itself, as a node does, and needs no node to run.
//! It is safe beside running nodes: reads are snapshot reads in read-only
//! transactions (they conflict with nobody), and it runs no reaper, no
//! heartbeat and no dispatcher. Its only writes are the actions asked
//! for (`cancel`, `remove`, `retry`, `pause`, `resume`), each one
//! ordinary transaction of the job service, the same that a node's
//! `job_cancel/2`, `job_remove/2`, `job_resubmit/4`, `job_pause/1` and
//! `job_resume/1` run, so running nodes see them as they see each other's
//! (a pause stops their acceptors, a resume wakes them). The service also
//! runs its orphan sweeper and pruner while the command runs (the tasks
//! every node runs: they only finish the failover of workers removed with
//! more running jobs than one transaction may move, and remove ended jobs
//! past their `keep`).
//!
//! Tables for people, one JSON object per line with `--json`; exit status
//! 0 on success, 1 with a one-line reason on stderr otherwise.

mod args;
mod output;

use std::process::ExitCode;
use std::sync::Arc;

use couch_workers_core::inspect;
use couch_workers_core::jobs::{ops, JobOpts, JobService, JobState};
use couch_workers_core::keyspace::Keyspace;
use couch_workers_core::log::{Discard, Logger};
use couch_workers_core::store::embedded::EmbeddedOptions;
use couch_workers_core::store::{self, run, Db, StoreConfig, TxOptions};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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

async fn open(store: &Store) -> Result<Db, String> {
    let config = match store {
        Store::Embedded(dir) => {
            // Opening would create an empty store: a mistyped path must be
            // an error, not a new store.
            let file = dir.join("couch_workers.sqlite");
            if !file.is_file() {
                return Err(format!("no store at {} (no couch_workers.sqlite there)", dir.display()));
            }
            StoreConfig::Embedded(EmbeddedOptions::new(dir))
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
    store::open(&config).await.map_err(|e| format!("cannot open the store: {e}"))
}

async fn read<T, F, Fut>(db: &Db, f: F) -> Result<T, String>
where
    F: FnMut(store::Tx) -> Fut,
    Fut: std::future::Future<Output = Result<T, store::StoreError>>,
{
    run(db.as_ref(), TxOptions::read(), f).await.map_err(|e| format!("store error: {e}"))
}

async fn execute(opts: &Options, out: &mut Out) -> Result<(), String> {
    let db = open(&opts.store).await?;
    let ks = Keyspace::new(&db.prefix());
    let result = command(&opts.command, &db, &ks, out).await;
    db.close();
    result
}

async fn command(cmd: &Command, db: &Db, ks: &Keyspace, out: &mut Out) -> Result<(), String> {
    match cmd {
        Command::Status => status(db, ks, out).await,
        Command::Workers(only) => {
            let types = match only {
                Some(t) => vec![t.clone()],
                None => read(db, |tx| async move { inspect::worker_types(&tx, ks).await }).await?,
            };
            out.workers_header();
            for t in &types {
                let t = t.as_slice();
                let ws = read(db, |tx| async move { inspect::workers(&tx, ks, t).await }).await?;
                if ws.is_empty() && only.is_some() {
                    return Err(format!("no registered workers of type {:?}", show(t)));
                }
                for w in &ws {
                    out.worker(t, w);
                }
            }
            Ok(())
        }
        Command::Jobs { job_type, states, limit, page } => jobs(db, ks, out, job_type, states, *limit, page).await,
        Command::Job(t, id) => {
            let service = job_service(db, ks);
            let job = service.get(t, id).await.map_err(|e| job_error(&e, t, id))?;
            out.jobs_header();
            out.job(&job);
            Ok(())
        }
        Command::Cancel(t, id) => {
            let service = job_service(db, ks);
            service.cancel(t, id).await.map_err(|e| job_error(&e, t, id))?;
            let job = service.get(t, id).await.map_err(|e| job_error(&e, t, id))?;
            out.done("canceled", &job);
            Ok(())
        }
        Command::Remove(t, id) => {
            let service = job_service(db, ks);
            service.remove(t, id).await.map_err(|e| job_error(&e, t, id))?;
            out.removed(t, id);
            Ok(())
        }
        Command::Retry(t, id) => {
            let service = job_service(db, ks);
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
        Command::Pause(t) | Command::Resume(t) => {
            let pause = matches!(cmd, Command::Pause(_));
            let paused = read_paused(db, ks, t).await?;
            // A type nobody knows is most likely a typo: refuse it.
            if !paused && total_jobs(db, ks, t).await? == 0 {
                let ts = t.as_slice();
                if read(db, |tx| async move { inspect::workers(&tx, ks, ts).await }).await?.is_empty() {
                    return Err(format!("no jobs or workers of type {:?}", show(t)));
                }
            }
            job_service(db, ks).set_paused(t, pause).await.map_err(|e| match e.name() {
                "key_too_large" => "the type is over the key limit".to_string(),
                _ => format!("store error: {e}"),
            })?;
            out.paused(t, pause, paused);
            Ok(())
        }
    }
}

/// The `jobs` command: one page, or every page (`--all`), each page one
/// read transaction (as `job_list/2` pages: a job that does not change
/// meanwhile is printed once, and none is skipped).
async fn jobs(
    db: &Db,
    ks: &Keyspace,
    out: &mut Out,
    t: &[u8],
    states: &[String],
    limit: usize,
    page: &Page,
) -> Result<(), String> {
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
        let (jobs, cont) = read(db, |tx| async move { ops::list(&tx, ks, t, only, limit, from).await }).await?;
        // Only a first page can tell that the type has no jobs at all.
        if first && from.is_none() && jobs.is_empty() && cont.is_none() && total_jobs(db, ks, t).await? == 0 {
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
async fn total_jobs(db: &Db, ks: &Keyspace, t: &[u8]) -> Result<u64, String> {
    Ok(read(db, |tx| async move { ops::counts(&tx, ks, t).await }).await?.iter().sum())
}

async fn read_paused(db: &Db, ks: &Keyspace, t: &[u8]) -> Result<bool, String> {
    read(db, |tx| async move { inspect::job_paused(&tx, ks, t).await }).await
}

fn job_error(e: &couch_workers_core::Error, t: &[u8], id: &[u8]) -> String {
    match e.name() {
        "not_found" => format!("no job {:?} of type {:?}", show(id), show(t)),
        "key_too_large" => "the type or id is over the key limit".into(),
        _ => format!("store error: {e}"),
    }
}

/// The job service on this store, for `job`, `cancel` and `remove`.
fn job_service(db: &Db, ks: &Keyspace) -> JobService {
    let tx = TxOptions::default();
    JobService::start(
        db.clone(),
        ks.clone(),
        Logger::new(Arc::new(Discard)),
        tx,
        tx,
        CancellationToken::new(),
        TaskTracker::new(),
        tokio::runtime::Handle::current(),
    )
}

async fn status(db: &Db, ks: &Keyspace, out: &mut Out) -> Result<(), String> {
    let types = read(db, |tx| async move { inspect::worker_types(&tx, ks).await }).await?;
    out.status_workers_header();
    for t in &types {
        let t = t.as_slice();
        let ws = read(db, |tx| async move { inspect::workers(&tx, ks, t).await }).await?;
        out.status_workers(t, &ws);
    }
    let job_types = read(db, |tx| async move { ops::job_types(&tx, ks).await }).await?;
    out.status_jobs_header();
    for t in &job_types {
        let t = t.as_slice();
        let counts = read(db, |tx| async move { ops::counts(&tx, ks, t).await }).await?;
        let paused = read_paused(db, ks, t).await?;
        out.status_jobs(t, &counts, paused);
    }
    Ok(())
}
