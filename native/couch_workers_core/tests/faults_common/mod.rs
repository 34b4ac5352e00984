//! Helpers of the `faults_*` tests: a log sink that keeps events, the
//! process's resident memory, a count of panics anywhere in the process
//! (background tasks included); an invariant check over the whole key
//! space read in one snapshot (`invariants`), real file-system faults
//! (tmpfs and read-only bind mounts, the immutable attribute) behind guards
//! that undo them even when a test fails (`fs_faults`), and another process
//! holding the store's SQLite write lock (`lock`); the `sim` store
//! scripting a landed `commit_unknown_result` for one write
//! (`unknown_commit`).

#![allow(dead_code)]

mod fs_faults;
mod invariants;
pub mod lock;
pub mod unknown_commit;

// Not every test binary that includes this module uses both.
#[allow(unused_imports)]
pub use fs_faults::*;
#[allow(unused_imports)]
pub use invariants::*;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use couch_workers_core::log::{Event, Sink, Value};

// ---- log --------------------------------------------------------------

/// A sink that keeps every event.
#[derive(Default)]
pub struct CaptureLog {
    events: Mutex<Vec<Event>>,
}

impl Sink for CaptureLog {
    fn log(&self, event: Event) {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).push(event);
    }
}

impl CaptureLog {
    pub fn new() -> Arc<CaptureLog> {
        Arc::new(CaptureLog::default())
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Events named `what` so far.
    pub fn named(&self, what: &str) -> Vec<Event> {
        self.events().into_iter().filter(|e| e.what == what).collect()
    }

    pub fn count(&self, what: &str) -> usize {
        self.named(what).len()
    }

    /// Waits up to `within` for the `n`th event named `what`.
    pub async fn wait_for(&self, what: &str, n: usize, within: Duration) -> Option<Event> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let found = self.named(what);
            if found.len() >= n {
                return found.into_iter().nth(n - 1);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A field of an event, as text.
pub fn field(event: &Event, key: &str) -> Option<String> {
    event.fields.iter().find(|(k, _)| *k == key).map(|(_, v)| match v {
        Value::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
        Value::Str(s) => s.clone(),
        Value::Int(i) => i.to_string(),
    })
}

// ---- panics -----------------------------------------------------------

static PANICS: AtomicUsize = AtomicUsize::new(0);
static HOOK: Once = Once::new();
/// The threads libtest runs tests on: a panic there is a failed assertion,
/// which fails its own test already.
static TEST_THREADS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Counts every panic of the process from now on outside the test
/// threads themselves: tokio swallows the panics of spawned tasks, this
/// sees them. Call it first thing in a test. Keeps the default report.
pub fn count_panics() {
    if let Some(name) = std::thread::current().name() {
        TEST_THREADS.lock().unwrap_or_else(|p| p.into_inner()).push(name.to_string());
    }
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let on_test_thread = std::thread::current()
                .name()
                .is_some_and(|n| TEST_THREADS.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|t| t == n));
            if !on_test_thread {
                PANICS.fetch_add(1, Ordering::SeqCst);
            }
            default(info);
        }));
    });
}

pub fn panics() -> usize {
    PANICS.load(Ordering::SeqCst)
}

// ---- memory -----------------------------------------------------------

/// Resident set size of this process, bytes (`/proc/self/statm`).
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

pub fn mb(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
