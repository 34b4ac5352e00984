//! The write connection's statements, one line each with its values bound
//! (SQLite's expanded SQL), appended to the file that the environment
//! variable `CW_SQL_TRACE` names: what `cw_sqlite_replay` runs again on
//! bare SQLite, to tell the engine's share of a workload from the store
//! code's (`bench/sqlite_replay.sh`).
//!
//! Built only with the feature `sql-trace`, and then active only where
//! `CW_SQL_TRACE` is set: a normal build has no trace hook at all.

use rusqlite::Connection;

/// Installs the trace on the store's write connection, if asked for.
#[cfg(feature = "sql-trace")]
pub(crate) fn install(conn: &mut Connection) {
    use std::io::{LineWriter, Write};
    use std::sync::Mutex;

    use rusqlite::trace::{TraceEvent, TraceEventCodes};

    let Some(path) = std::env::var_os("CW_SQL_TRACE") else { return };
    let file = match std::fs::OpenOptions::new().create(true).append(true).open(&path) {
        Ok(file) => file,
        Err(e) => {
            // A benchmark's tool, not a node's: say why and go on untraced.
            eprintln!("sql-trace: cannot open {}: {e}; not tracing", path.to_string_lossy());
            return;
        }
    };
    // Line by line: the store may be dropped without a close, and a
    // half-written last line would make the replay fail.
    let out = Mutex::new(LineWriter::new(file));
    let traced = conn.trace_v2(
        TraceEventCodes::SQLITE_TRACE_STMT,
        Some(move |event: TraceEvent<'_>| {
            if let TraceEvent::Stmt(stmt, _) = event {
                if let Ok(mut out) = out.lock() {
                    // A statement SQLite could not expand is marked, so
                    // that the replay stops on it rather than skip work.
                    let _ = match stmt.expanded_sql() {
                        Some(sql) => writeln!(out, "{sql}"),
                        None => writeln!(out, "-- unexpanded: {}", stmt.sql()),
                    };
                }
            }
        }),
    );
    if let Err(e) = traced {
        eprintln!("sql-trace: cannot install the trace: {e}; not tracing");
    }
}

/// Installs nothing: built without the feature `sql-trace`.
#[cfg(not(feature = "sql-trace"))]
pub(crate) fn install(_conn: &mut Connection) {}
