//! Stage stamps for the bench's per-stage split of a cross-node wake-up
//! (M2, J3x; `bench/stages.py`, figures in `bench/RESULTS.md`, "M2 and
//! J3x", 2 Dec 2026).
//!
//! Built only with the `stage-trace` feature, and then active only when
//! `CW_STAGE_TRACE` names a directory: each [`mark`] appends one line
//! `<CLOCK_REALTIME ns> <stage>` to `CW_STAGE_TRACE/<pid>.stages` (one
//! `write(2)` on an `O_APPEND` descriptor, so lines of several threads do
//! not interleave). The realtime clock because the Erlang side of the
//! bench stamps with `os:system_time/1`: one clock for every process of
//! the host. Without the feature [`mark`] is an empty inline function.

#[cfg(feature = "stage-trace")]
mod on {
    use std::io::Write;
    use std::sync::OnceLock;
    use std::time::{SystemTime, UNIX_EPOCH};

    static FILE: OnceLock<Option<std::fs::File>> = OnceLock::new();

    fn file() -> Option<&'static std::fs::File> {
        FILE.get_or_init(|| {
            let dir = std::env::var_os("CW_STAGE_TRACE")?;
            let path = std::path::Path::new(&dir).join(format!("{}.stages", std::process::id()));
            std::fs::OpenOptions::new().create(true).append(true).open(path).ok()
        })
        .as_ref()
    }

    pub fn mark(stage: &'static str) {
        let Some(mut f) = file() else { return };
        let ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        // One buffer, one write: the line stays whole.
        let line = format!("{ns} {stage}\n");
        let _ = f.write_all(line.as_bytes());
    }
}

/// Records that `stage` happened now (see the module doc).
#[cfg(feature = "stage-trace")]
pub fn mark(stage: &'static str) {
    on::mark(stage);
}

/// Records nothing: built without the `stage-trace` feature.
#[cfg(not(feature = "stage-trace"))]
#[inline(always)]
pub fn mark(_stage: &'static str) {}
