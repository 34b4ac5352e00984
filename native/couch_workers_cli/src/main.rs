//! `couch-workers`: the operators' command line (DESIGN.md "Operations").
//!
//! It opens the store itself, as a node does, and needs no node to run.
//! It is safe beside running nodes: reads are snapshot reads in read-only
//! transactions (they conflict with nobody), and it runs no reaper, no
//! heartbeat and no dispatcher. Its only writes are the actions asked
//! for (`cancel`, `remove`), each one ordinary transaction of the job
//! service, which also runs its orphan sweeper while the command runs
//! (the task every node runs: it only finishes the failover of workers
//! removed with more running jobs than one transaction may move).
//!
//! Tables for people, one JSON object per line with `--json`; exit status
//! 0 on success, 1 with a one-line reason on stderr otherwise.

mod args;
mod output;

use std::process::ExitCode;
use std::sync::Arc;

use couch_workers_core::inspect;
use couch_workers_core::jobs::JobService;
use couch_workers_core::keyspace::Keyspace;
use couch_workers_core::log::Discard;
use couch_workers_core::store::embedded::EmbeddedOptions;
use couch_workers_core::store::{self, run, Db, StoreConfig, TxOptions};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use args::{Command, Options, Store};
use output::Out;

/// Records `jobs` reads at most to fill a page filtered by state.
const SCAN: usize = 10_000;

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
        Command::Jobs { job_type, states, limit } => {
            let t = job_type.as_slice();
            let (jobs, more) =
                read(db, |tx| async move { inspect::jobs_page(&tx, ks, t, states, *limit, SCAN).await }).await?;
            if jobs.is_empty() && !more {
                let any = read(db, |tx| async move { inspect::jobs_page(&tx, ks, t, &[], 1, 1).await }).await?;
                if any.0.is_empty() {
                    return Err(format!("no jobs of type {:?}", show(t)));
                }
            }
            out.jobs_header();
            for j in &jobs {
                out.job(j);
            }
            if more {
                out.note(&format!("(at most {limit} shown, {SCAN} records read at most: more may follow)"));
            }
            Ok(())
        }
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
        Command::Retry(..) => Err("retry is not implemented yet: the job API has no failed state to retry from yet".into()),
        Command::Pause(_) | Command::Resume(_) => {
            Err("pause and resume are not implemented yet: the job API cannot pause a type yet".into())
        }
    }
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
        Arc::new(Discard),
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
    let job_types = read(db, |tx| async move { inspect::job_types(&tx, ks).await }).await?;
    out.status_jobs_header();
    for t in &job_types {
        let t = t.as_slice();
        let pending = read(db, |tx| async move { couch_workers_core::jobs::ops::pending_count(&tx, ks, t).await }).await?;
        out.status_jobs(t, pending);
    }
    Ok(())
}
