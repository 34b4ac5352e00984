//! What the command line prints: aligned tables for people, or one JSON
//! object per line (`--json`) for scripts. Ids and types are bytes; they
//! are shown as UTF-8, with the bytes that are not replaced by U+FFFD.

use couch_workers_core::job_controls::ActivityTimeout;
use couch_workers_core::recurring::ScheduleEntry;
use couch_workers_core::{Job, JobState, WorkerInfo};
use serde_json::{json, Value};

pub struct Out {
    json: bool,
    /// The table being built: its header and rows, printed by `flush`.
    tables: Vec<(Vec<&'static str>, Vec<Vec<String>>)>,
    lines: Vec<String>,
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A stored JSON object as a value (stored bytes that are no JSON as a string).
fn stored_json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap_or_else(|_| Value::String(text(bytes)))
}

/// Unix ms as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC).
fn utc(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map_or_else(|| format!("{ms} ms"), |at| at.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
}

fn age(ms: Option<u64>) -> String {
    ms.map_or("-".into(), |ms| format!("{:.1} s", ms as f64 / 1000.0))
}

impl Out {
    pub fn new(json: bool) -> Out {
        Out { json, tables: Vec::new(), lines: Vec::new() }
    }

    fn header(&mut self, columns: Vec<&'static str>) {
        if !self.json {
            self.tables.push((columns, Vec::new()));
        }
    }

    fn row(&mut self, cells: Vec<String>, value: Value) {
        if self.json {
            self.lines.push(value.to_string());
        } else if let Some((_, rows)) = self.tables.last_mut() {
            rows.push(cells);
        }
    }

    pub fn note(&mut self, note: &str) {
        if !self.json {
            self.tables.push((vec![], vec![vec![note.to_string()]]));
        }
    }

    /// After a page that has more: the cursor of the next (`--after`). A
    /// JSON line of its own, `{"next":CURSOR}`, with `--json`.
    pub fn next_page(&mut self, cursor: &str) {
        if self.json {
            self.lines.push(json!({ "next": cursor }).to_string());
        } else {
            self.note(&format!("(more follow: --after {cursor})"));
        }
    }

    pub fn workers_header(&mut self) {
        self.header(vec!["TYPE", "ID", "TIMEOUT", "HEARTBEAT AGE", "RUNNING", "LEADER", "OPTIONS"]);
    }

    /// A worker; `leader`: it is its type's leader (its oldest registration).
    pub fn worker(&mut self, t: &[u8], w: &WorkerInfo, leader: bool) {
        let value = json!({
            "type": text(t), "id": text(&w.id), "opts": stored_json(&w.options_json),
            "timeout": w.timeout_s, "heartbeat_age_ms": w.heartbeat_age_ms, "running": w.running, "leader": leader,
        });
        let cells = vec![
            text(t),
            text(&w.id),
            w.timeout_s.map_or("-".into(), |s| format!("{s} s")),
            age(w.heartbeat_age_ms),
            w.running.to_string(),
            if leader { "leader".into() } else { "-".into() },
            text(&w.options_json),
        ];
        self.row(cells, value);
    }

    pub fn jobs_header(&mut self) {
        self.header(vec!["TYPE", "ID", "STATE", "WORKER", "PRIORITY", "ATTEMPTS", "ERROR", "INFO"]);
    }

    fn job_value(j: &Job) -> Value {
        json!({
            "type": text(&j.job_type), "id": text(&j.id), "state": j.state.name(),
            "worker": j.worker.as_deref().map(text), "priority": j.priority,
            "info": stored_json(&j.info), "result": j.result.as_deref().map(stored_json),
            "attempts": j.attempts, "cancel_requested": j.cancel_requested,
            "error": j.error.as_deref().map(stored_json),
            "unique": j.unique.as_deref().map(text),
            "group": j.group.as_deref().map(text),
            "activity_timeout": match j.activity_timeout {
                None => Value::Null,
                Some(ActivityTimeout::Seconds(s)) => json!(s),
                Some(ActivityTimeout::Infinity) => json!("infinity"),
            },
        })
    }

    pub fn job(&mut self, j: &Job) {
        let cells = vec![
            text(&j.job_type),
            text(&j.id),
            if j.cancel_requested { format!("{} (cancel requested)", j.state.name()) } else { j.state.name().into() },
            j.worker.as_deref().map_or("-".into(), text),
            j.priority.to_string(),
            j.attempts.to_string(),
            j.error.as_deref().map_or("-".into(), text),
            text(&j.info),
        ];
        self.row(cells, Self::job_value(j));
    }

    /// After an action on a job: the job as it is now.
    pub fn done(&mut self, action: &'static str, j: &Job) {
        let mut value = Self::job_value(j);
        value["action"] = json!(action);
        self.header(vec!["ACTION", "TYPE", "ID", "STATE"]);
        let state =
            if j.cancel_requested { format!("{} (cancel requested)", j.state.name()) } else { j.state.name().into() };
        self.row(vec![action.into(), text(&j.job_type), text(&j.id), state], value);
    }

    pub fn removed(&mut self, t: &[u8], id: &[u8]) {
        self.header(vec!["ACTION", "TYPE", "ID"]);
        self.row(
            vec!["removed".into(), text(t), text(id)],
            json!({"action": "removed", "type": text(t), "id": text(id)}),
        );
    }

    pub fn status_workers_header(&mut self) {
        self.header(vec!["WORKER TYPE", "WORKERS", "RUNNING", "OLDEST HEARTBEAT", "LEADER"]);
    }

    pub fn status_workers(&mut self, t: &[u8], ws: &[WorkerInfo], leader: Option<&[u8]>) {
        let running: u64 = ws.iter().map(|w| w.running).sum();
        let oldest = ws.iter().filter_map(|w| w.heartbeat_age_ms).max();
        self.row(
            vec![text(t), ws.len().to_string(), running.to_string(), age(oldest), leader.map_or("-".into(), text)],
            json!({"worker_type": text(t), "workers": ws.len(), "running": running, "oldest_heartbeat_age_ms": oldest,
                   "leader": leader.map(text)}),
        );
    }

    pub fn schedules_header(&mut self) {
        self.header(vec!["TYPE", "SCHEDULE", "NEXT RUN (UTC)", "LAST RUN", "SPEC", "INFO"]);
    }

    pub fn schedule(&mut self, t: &[u8], e: &ScheduleEntry) {
        let value = json!({
            "type": text(t), "id": text(&e.id), "spec": stored_json(&e.spec_json), "info": stored_json(&e.info),
            "next_run_at": e.next_run_at, "last_run": e.last_run.as_deref().map(text),
        });
        let cells = vec![
            text(t),
            text(&e.id),
            utc(e.next_run_at),
            e.last_run.as_deref().map_or("-".into(), text),
            text(&e.spec_json),
            text(&e.info),
        ];
        self.row(cells, value);
    }

    pub fn schedule_removed(&mut self, t: &[u8], id: &[u8]) {
        self.header(vec!["ACTION", "TYPE", "SCHEDULE"]);
        self.row(
            vec!["schedule removed".into(), text(t), text(id)],
            json!({"action": "schedule_removed", "type": text(t), "id": text(id)}),
        );
    }

    pub fn status_jobs_header(&mut self) {
        self.header(vec!["JOB TYPE", "SCHEDULED", "PENDING", "RUNNING", "FINISHED", "CANCELED", "FAILED", "PAUSED"]);
    }

    /// `counts` in [`JobState::ALL`]'s order.
    pub fn status_jobs(&mut self, t: &[u8], counts: &[(JobState, u64); 6], paused: bool) {
        let mut value = json!({"job_type": text(t)});
        let mut cells = vec![text(t)];
        for (state, n) in counts {
            value[state.name()] = json!(n);
            cells.push(n.to_string());
        }
        value["paused"] = json!(paused);
        cells.push(if paused { "yes".into() } else { "no".into() });
        self.row(cells, value);
    }

    /// After `pause` or `resume`: the flag now, and whether it was set before.
    pub fn paused(&mut self, t: &[u8], paused: bool, was: bool) {
        let action = if paused { "paused" } else { "resumed" };
        self.header(vec!["ACTION", "TYPE", "PAUSED", "BEFORE"]);
        self.row(
            vec![
                action.into(),
                text(t),
                if paused { "yes" } else { "no" }.into(),
                if was { "paused" } else { "not paused" }.into(),
            ],
            json!({"action": action, "type": text(t), "paused": paused, "was_paused": was}),
        );
    }

    /// One job and its last runs, newest first (`job`): the job's row,
    /// then a table of its runs; with `--json`, one line with `history`.
    pub fn job_with_history(&mut self, j: &Job, runs: &[couch_workers_core::job_controls::Run]) {
        if self.json {
            let mut value = Self::job_value(j);
            value["history"] = runs
                .iter()
                .map(|r| {
                    json!({
                        "attempt": r.attempt, "worker": text(&r.worker), "started_at": r.started_at,
                        "ended_at": r.ended_at, "outcome": r.outcome.name(),
                        "error": r.error.as_deref().map(stored_json),
                    })
                })
                .collect();
            self.lines.push(value.to_string());
            return;
        }
        self.job(j);
        self.header(vec!["RUN", "WORKER", "STARTED (UNIX MS)", "ENDED (UNIX MS)", "OUTCOME", "ERROR"]);
        for r in runs {
            let cells = vec![
                r.attempt.to_string(),
                text(&r.worker),
                r.started_at.to_string(),
                r.ended_at.map_or("-".into(), |t| t.to_string()),
                r.outcome.name().into(),
                r.error.as_deref().map_or("-".into(), text),
            ];
            self.row(cells, Value::Null);
        }
    }

    /// A job type's settings (`type`), `infinity` where unset.
    pub fn type_settings(&mut self, t: &[u8], s: &couch_workers_core::job_controls::TypeSettings) {
        let cell = |v: Option<u64>| v.map_or("infinity".to_string(), |n| n.to_string());
        let value = |v: Option<u64>| v.map_or(json!("infinity"), |n| json!(n));
        self.header(vec!["TYPE", "ACTIVITY TIMEOUT (S)", "MAX RUNNING", "MAX RUNNING PER GROUP"]);
        self.row(
            vec![text(t), cell(s.activity_timeout), cell(s.max_running), cell(s.max_running_per_group)],
            json!({
                "type": text(t),
                "activity_timeout": value(s.activity_timeout),
                "max_running": value(s.max_running),
                "max_running_per_group": value(s.max_running_per_group),
            }),
        );
    }

    /// Prints what was built.
    pub fn flush(&mut self) {
        for line in self.lines.drain(..) {
            println!("{line}");
        }
        for (i, (header, rows)) in self.tables.drain(..).enumerate() {
            if i > 0 {
                println!();
            }
            if header.is_empty() {
                for r in rows {
                    println!("{}", r.join(" "));
                }
                continue;
            }
            let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
            for r in &rows {
                for (w, c) in widths.iter_mut().zip(r) {
                    *w = (*w).max(c.chars().count());
                }
            }
            let line = |cells: Vec<String>| {
                let n = cells.len();
                let padded: Vec<String> = cells
                    .into_iter()
                    .zip(&widths)
                    .enumerate()
                    .map(|(i, (c, w))| if i + 1 == n { c } else { format!("{c:<w$}") })
                    .collect();
                println!("{}", padded.join("  "));
            };
            line(header.iter().map(|h| h.to_string()).collect());
            for r in rows {
                line(r);
            }
        }
    }
}
