//! The command line's arguments, checked before the store is opened.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use couch_workers_core::job_controls::TypeSetting;

pub const USAGE: &str = "\
usage: couch-workers [--store embedded:DIR | fdb:CLUSTER_FILE] [--json] COMMAND
commands:
  status                                   worker types and job types at a glance
  workers [TYPE]                           registered workers (all types, or TYPE)
  jobs TYPE [--state S]... [--limit N] [--after CURSOR | --all]
                                           jobs of TYPE in id order, N a page (1..1000, default 100);
                                           a page that has more prints its CURSOR; --all reads every page
  job TYPE ID                              one job
  cancel TYPE ID | remove TYPE ID          act on one job
  retry TYPE ID                            a failed job back to pending (attempts 0)
  pause TYPE | resume TYPE                 no worker on any node takes TYPE's jobs / again
  schedules TYPE                           TYPE's recurring jobs: spec, next run, last run
  schedule-remove TYPE ID                  remove a schedule (the jobs it created stay)
  type TYPE [--max-running N] [--max-running-per-group N] [--activity-timeout S]
                                           TYPE's settings, cluster-wide; each option (N, S a positive
                                           integer or infinity) changes one first
--store defaults to embedded:couch_workers_data (the app's default store).
--store fdb-test:NAME:CLUSTER_FILE is the test store of the EUnit suites on
FoundationDB (the directory couch_workers_test/NAME), left in place.
";

/// The job states a `--state` may name.
pub const STATES: [&str; 6] = ["scheduled", "pending", "running", "finished", "canceled", "failed"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Store {
    Embedded(PathBuf),
    Fdb(PathBuf),
    /// A test store on FoundationDB: its name and cluster file.
    FdbTest(String, PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Status,
    Workers(Option<Vec<u8>>),
    Jobs {
        job_type: Vec<u8>,
        states: Vec<String>,
        limit: usize,
        page: Page,
    },
    Job(Vec<u8>, Vec<u8>),
    Cancel(Vec<u8>, Vec<u8>),
    Remove(Vec<u8>, Vec<u8>),
    Retry(Vec<u8>, Vec<u8>),
    Pause(Vec<u8>),
    Resume(Vec<u8>),
    Schedules(Vec<u8>),
    ScheduleRemove(Vec<u8>, Vec<u8>),
    /// Shows the type's settings, after changing those given.
    Type(Vec<u8>, Vec<TypeSetting>),
}

/// Which pages of `jobs` to print.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Page {
    /// The first page.
    First,
    /// The page after the job id that a cursor names.
    After(Vec<u8>),
    /// Every page, one read transaction each.
    All,
}

/// A page's cursor: the hex of the last job id it holds (ids are bytes,
/// which a terminal or a shell may not carry intact).
pub fn cursor(last_id: &[u8]) -> String {
    last_id.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_cursor(value: &str) -> Result<Vec<u8>, String> {
    let bad = || format!("--after {value:?} is not a cursor (the hex a page printed)");
    if value.is_empty() || !value.len().is_multiple_of(2) || !value.is_ascii() {
        return Err(bad());
    }
    (0..value.len()).step_by(2).map(|i| u8::from_str_radix(&value[i..i + 2], 16).map_err(|_| bad())).collect()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub store: Store,
    pub json: bool,
    pub command: Command,
}

/// Parses the arguments after the program's name; `Err` is the one-line
/// reason.
pub fn parse(args: Vec<OsString>) -> Result<Options, String> {
    let mut store = Store::Embedded(PathBuf::from("couch_workers_data"));
    let mut json = false;
    let mut states = Vec::new();
    let mut limit: Option<usize> = None;
    let mut page: Option<Page> = None;
    let mut settings: Vec<TypeSetting> = Vec::new();
    let mut words: Vec<Vec<u8>> = Vec::new();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        if crate::type_args::is_option(arg.as_bytes()) {
            let value = it.next().map(|v| v.to_string_lossy().into_owned());
            settings.push(crate::type_args::setting(arg.as_bytes(), value.as_deref())?);
            continue;
        }
        match arg.as_bytes() {
            b"--json" => json = true,
            b"--store" => store = store_arg(it.next().ok_or("--store needs a value")?)?,
            b"--state" => {
                let s = it.next().ok_or("--state needs a value")?.to_string_lossy().into_owned();
                if !STATES.contains(&s.as_str()) {
                    return Err(format!("unknown state {s:?} (one of: {})", STATES.join(", ")));
                }
                states.push(s);
            }
            b"--limit" => {
                let v = it.next().ok_or("--limit needs a value")?;
                let n: usize = v.to_string_lossy().parse().map_err(|_| format!("--limit {v:?} is not a number"))?;
                if !(1..=1000).contains(&n) {
                    return Err(format!("--limit {n} is outside 1..1000"));
                }
                limit = Some(n);
            }
            b"--after" | b"--all" => {
                if page.is_some() {
                    return Err("--after and --all go once, and not together".into());
                }
                page = Some(match arg.as_bytes() {
                    b"--all" => Page::All,
                    _ => Page::After(parse_cursor(&it.next().ok_or("--after needs a value")?.to_string_lossy())?),
                });
            }
            b"--help" | b"-h" => return Err(String::new()),
            a if a.starts_with(b"--") => return Err(format!("unknown option {:?}", arg)),
            _ => words.push(arg.into_vec()),
        }
    }
    let (name, rest) = words.split_first().ok_or("no command given")?;
    let name = String::from_utf8_lossy(name).into_owned();
    if (!states.is_empty() || limit.is_some() || page.is_some()) && name != "jobs" {
        return Err("--state, --limit, --after and --all go with the jobs command only".into());
    }
    if !settings.is_empty() && name != "type" {
        return Err(
            "--max-running, --max-running-per-group and --activity-timeout go with the type command only".into()
        );
    }
    let command = match (name.as_str(), rest) {
        ("status", []) => Command::Status,
        ("workers", []) => Command::Workers(None),
        ("workers", [t]) => Command::Workers(Some(t.clone())),
        ("jobs", [t]) => Command::Jobs {
            job_type: t.clone(),
            states,
            limit: limit.unwrap_or(100),
            page: page.unwrap_or(Page::First),
        },
        ("job", [t, id]) => Command::Job(t.clone(), id.clone()),
        ("cancel", [t, id]) => Command::Cancel(t.clone(), id.clone()),
        ("remove", [t, id]) => Command::Remove(t.clone(), id.clone()),
        ("retry", [t, id]) => Command::Retry(t.clone(), id.clone()),
        ("pause", [t]) => Command::Pause(t.clone()),
        ("resume", [t]) => Command::Resume(t.clone()),
        ("schedules", [t]) => Command::Schedules(t.clone()),
        ("schedule-remove", [t, id]) => Command::ScheduleRemove(t.clone(), id.clone()),
        ("type", [t]) => Command::Type(t.clone(), settings),
        ("type", _) => return Err("wrong arguments for type".into()),
        (
            "status" | "workers" | "jobs" | "job" | "cancel" | "remove" | "retry" | "pause" | "resume" | "schedules"
            | "schedule-remove",
            _,
        ) => return Err(format!("wrong arguments for {name}")),
        _ => return Err(format!("unknown command {name:?}")),
    };
    Ok(Options { store, json, command })
}

fn store_arg(value: OsString) -> Result<Store, String> {
    let bytes = value.as_bytes();
    let path = |rest: &[u8]| {
        if rest.is_empty() {
            Err(format!("--store {value:?}: the path is empty"))
        } else {
            Ok(PathBuf::from(std::ffi::OsStr::from_bytes(rest)))
        }
    };
    if let Some(rest) = bytes.strip_prefix(b"embedded:") {
        Ok(Store::Embedded(path(rest)?))
    } else if let Some(rest) = bytes.strip_prefix(b"fdb:") {
        Ok(Store::Fdb(path(rest)?))
    } else if let Some(rest) = bytes.strip_prefix(b"fdb-test:") {
        let (name, file) = match rest.iter().position(|b| *b == b':') {
            Some(i) if i > 0 => (&rest[..i], &rest[i + 1..]),
            _ => return Err(format!("--store {value:?}: expected fdb-test:NAME:CLUSTER_FILE")),
        };
        let name = String::from_utf8(name.to_vec()).map_err(|_| format!("--store {value:?}: NAME is not UTF-8"))?;
        Ok(Store::FdbTest(name, path(file)?))
    } else {
        Err(format!("--store {value:?}: expected embedded:DIR or fdb:CLUSTER_FILE"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Options, String> {
        parse(args.iter().map(OsString::from).collect())
    }

    #[test]
    fn schedule_commands() {
        assert_eq!(p(&["schedules", "t"]).unwrap().command, Command::Schedules(b"t".to_vec()));
        assert_eq!(
            p(&["schedule-remove", "t", "nightly"]).unwrap().command,
            Command::ScheduleRemove(b"t".to_vec(), b"nightly".to_vec())
        );
        assert!(p(&["schedules"]).unwrap_err().contains("wrong arguments"));
        assert!(p(&["schedule-remove", "t"]).unwrap_err().contains("wrong arguments"));
    }

    #[test]
    fn commands_and_options() {
        let o = p(&["--store", "embedded:/d", "--json", "jobs", "t", "--state", "pending", "--limit", "5"]).unwrap();
        assert_eq!(o.store, Store::Embedded("/d".into()));
        assert!(o.json);
        assert_eq!(
            o.command,
            Command::Jobs { job_type: b"t".to_vec(), states: vec!["pending".into()], limit: 5, page: Page::First }
        );
        let after = |args: &[&str]| match p(args).unwrap().command {
            Command::Jobs { page, .. } => page,
            other => panic!("{other:?}"),
        };
        assert_eq!(after(&["jobs", "t", "--after", "6A00ff"]), Page::After(vec![0x6a, 0, 0xff]));
        assert_eq!(after(&["jobs", "t", "--all", "--limit", "3"]), Page::All);
        assert_eq!(cursor(&[0x6a, 0, 0xff]), "6a00ff");
        assert_eq!(parse_cursor(&cursor(b"any \xff id")).unwrap(), b"any \xff id");
        assert_eq!(p(&["status"]).unwrap().store, Store::Embedded("couch_workers_data".into()));
        assert_eq!(
            p(&["--store", "fdb:/etc/fdb.cluster", "workers"]).unwrap().store,
            Store::Fdb("/etc/fdb.cluster".into())
        );
        assert_eq!(
            p(&["--store", "fdb-test:cw_1:/tmp/fdb.cluster", "workers"]).unwrap().store,
            Store::FdbTest("cw_1".into(), "/tmp/fdb.cluster".into())
        );
        assert!(p(&["--store", "fdb-test::/tmp/fdb.cluster", "workers"]).is_err(), "a name is needed");
        assert!(p(&["--store", "fdb-test:cw_1:", "workers"]).is_err(), "a path is needed");
        assert_eq!(p(&["cancel", "t", "j"]).unwrap().command, Command::Cancel(b"t".to_vec(), b"j".to_vec()));
        assert_eq!(p(&["type", "t"]).unwrap().command, Command::Type(b"t".to_vec(), vec![]));
        assert_eq!(
            p(&["type", "t", "--max-running", "8", "--activity-timeout", "infinity"]).unwrap().command,
            Command::Type(b"t".to_vec(), vec![TypeSetting::MaxRunning(Some(8)), TypeSetting::ActivityTimeout(None)])
        );
    }

    #[test]
    fn bad_arguments_are_refused() {
        for bad in [
            &[][..],
            &["frobnicate"],
            &["job", "t"],
            &["status", "extra"],
            &["jobs", "t", "--state", "sleeping"],
            &["jobs", "t", "--limit", "0"],
            &["jobs", "t", "--limit", "1001"],
            &["jobs", "t", "--limit", "x"],
            &["workers", "--limit", "3"],
            &["workers", "--all"],
            &["jobs", "t", "--after"],
            &["jobs", "t", "--after", ""],
            &["jobs", "t", "--after", "abc"],
            &["jobs", "t", "--after", "zz"],
            &["jobs", "t", "--after", "é0"],
            &["jobs", "t", "--after", "00", "--all"],
            &["jobs", "t", "--all", "--all"],
            &["--store", "mysql:/x", "status"],
            &["--store", "embedded:", "status"],
            &["--store"],
            &["--verbose", "status"],
            &["type"],
            &["type", "t", "u"],
            &["type", "t", "--max-running", "0"],
            &["type", "t", "--max-running"],
            &["jobs", "t", "--max-running", "3"],
        ] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
    }
}
