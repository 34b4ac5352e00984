//! Log events and spans, through `tracing`. The core never prints.
//!
//! **Events.** A call site writes
//! `log_event!(self.log, Warning, "heartbeat_failed", "type" = spec.worker_type.as_slice(), reason = %e)`:
//! a `tracing` event whose name is the report's `what`, with target
//! [`TARGET`] and the fields as given. The macro adds two: `node`, the
//! [`Logger`]'s route (absent for [`Logger::PROCESS`]), and `notice`
//! (Erlang's `logger` has a `notice` level between `info` and `warning`,
//! `tracing` has not: a notice is an `INFO` event with `notice = true`).
//!
//! **One path to a sink.** The first [`Logger`] (or the first
//! transaction) installs one process-wide subscriber, [`Process`]. It
//! turns each event of [`TARGET`] back into an [`Event`] (byte fields stay
//! bytes, strings strings, integers integers) and hands it to the [`Sink`]
//! of the route its `node` names, or to the process sink
//! ([`set_process_sink`]) when it names none; the [`Forward`] layer does
//! the same on a host's registry. The NIF's sink sends it to Erlang's
//! `logger` as a report map; a test's sink collects it.
//!
//! *Why a route field and not a subscriber per node.* A node's tasks run
//! on every thread of the runtime, and tests run several nodes in one
//! process: a thread-local subscriber (or `WithSubscriber` on every task a
//! node spawns) would have to be carried through each spawn, and one
//! missed spawn would send its events to the wrong place. A field travels
//! with the event itself, and the lookup (a read lock on a small map, per
//! event; events are not on a hot path) happens in one place.
//!
//! **Spans.** `transaction` (the store's retry loop: `writes`, and its
//! tally, recorded when the run ends: `attempts`, `conflicts`, `retries`,
//! `outcome`, `duration_us`), `heartbeat` (one renewal: `workers`), `reap`
//! (one suspect: `type`, `id`) and `accept_round` (`type`), all at `DEBUG`
//! with target [`TARGET`]. [`Process`] takes the `transaction` span, whose
//! tally feeds the store's counters (`metrics.rs`, added up here by
//! [`Count`]): that span is always on. It takes no interest in the other
//! three, so they are disabled at their call site: creating, entering and
//! recording one costs a cached-interest check and nothing else (see
//! bench/RESULTS.md, "tracing" and "the store's counters from the
//! transaction span"). A host that installs its own subscriber before the
//! first node starts gets the events and the spans (with their timings)
//! there instead; no sink sees them, and the store's counters do not move,
//! unless that subscriber stacks [`forward()`] and [`count()`] among its
//! layers.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once, RwLock};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event as TracingEvent, Metadata, Subscriber};
use tracing_subscriber::filter::{filter_fn, Filtered};
use tracing_subscriber::layer::{Context, Layer};

use crate::metrics::STORE;

// The macros below expand to `$crate::__tracing::...` (re-exported by
// lib.rs), so a crate
// that logs through them (the NIF) needs no `tracing` dependency of its own.
#[doc(hidden)]
pub use tracing as __tracing;

/// The `tracing` target of every event and span of couch_workers.
pub const TARGET: &str = "couch_workers";

/// The `outcome` of a `transaction` span whose run committed (any other
/// outcome names the error it gave up with).
pub const COMMITTED: &str = "committed";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Notice,
    Warning,
    Error,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Notice => "notice",
            Level::Warning => "warning",
            Level::Error => "error",
        }
    }

    fn of(level: &tracing::Level, notice: bool) -> Level {
        match *level {
            tracing::Level::ERROR => Level::Error,
            tracing::Level::WARN => Level::Warning,
            tracing::Level::INFO if notice => Level::Notice,
            tracing::Level::INFO => Level::Info,
            _ => Level::Debug,
        }
    }
}

/// A field value of a log event.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Bytes(Vec<u8>),
    Str(String),
    Int(i64),
}

/// One structured event: `what` names it, `fields` say the rest.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub level: Level,
    pub what: &'static str,
    pub fields: Vec<(&'static str, Value)>,
}

/// Where events go.
pub trait Sink: Send + Sync {
    fn log(&self, event: Event);
}

/// A sink that drops everything (tests, benchmarks).
pub struct Discard;

impl Sink for Discard {
    fn log(&self, _event: Event) {}
}

/// Logs an event through `tracing` (see the module doc):
/// `log_event!(logger, Level, "what", field = value, ...)` with `Level` one
/// of `Debug`, `Info`, `Notice`, `Warning`, `Error` and fields as in
/// `tracing::event!` (`"type" = bytes`, `reason = %error`, `count = n`).
#[macro_export]
macro_rules! log_event {
    ($log:expr, Debug, $what:literal $(, $($field:tt)+)?) => {
        $crate::__log_event!($log, DEBUG, false, $what $(, $($field)+)?)
    };
    ($log:expr, Info, $what:literal $(, $($field:tt)+)?) => {
        $crate::__log_event!($log, INFO, false, $what $(, $($field)+)?)
    };
    ($log:expr, Notice, $what:literal $(, $($field:tt)+)?) => {
        $crate::__log_event!($log, INFO, true, $what $(, $($field)+)?)
    };
    ($log:expr, Warning, $what:literal $(, $($field:tt)+)?) => {
        $crate::__log_event!($log, WARN, false, $what $(, $($field)+)?)
    };
    ($log:expr, Error, $what:literal $(, $($field:tt)+)?) => {
        $crate::__log_event!($log, ERROR, false, $what $(, $($field)+)?)
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __log_event {
    ($log:expr, $level:ident, $notice:literal, $what:literal $(, $($field:tt)+)?) => {
        $crate::__tracing::event!(
            name: $what,
            target: "couch_workers",
            $crate::__tracing::Level::$level,
            node = $crate::Logger::node(&$log),
            notice = $notice
            $(, $($field)+)?
        )
    };
}

/// A node's handle for logging: names the sink its events go to. Clones
/// share the route; it is removed when the last clone is dropped (events
/// logged after that go nowhere).
#[derive(Clone)]
pub struct Logger {
    route: Option<Arc<Route>>,
}

struct Route {
    node: u64,
}

static NEXT_ROUTE: AtomicU64 = AtomicU64::new(1);
static ROUTES: RwLock<BTreeMap<u64, Arc<dyn Sink>>> = RwLock::new(BTreeMap::new());
static PROCESS_SINK: RwLock<Option<Arc<dyn Sink>>> = RwLock::new(None);

impl Logger {
    /// Events that belong to no node (the NIF's own, a panic): they go to
    /// the process sink.
    pub const PROCESS: Logger = Logger { route: None };

    /// A new route to `sink`.
    pub fn new(sink: Arc<dyn Sink>) -> Logger {
        install();
        let node = NEXT_ROUTE.fetch_add(1, Ordering::Relaxed);
        write(&ROUTES).insert(node, sink);
        Logger { route: Some(Arc::new(Route { node })) }
    }

    /// The route's number, as the `node` field of its events.
    pub fn node(&self) -> Option<u64> {
        self.route.as_ref().map(|r| r.node)
    }
}

impl Drop for Route {
    fn drop(&mut self) {
        write(&ROUTES).remove(&self.node);
    }
}

impl fmt::Debug for Logger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Logger").field("node", &self.node()).finish()
    }
}

/// Sets (or, with `None`, clears) the sink of events that name no node.
pub fn set_process_sink(sink: Option<Arc<dyn Sink>>) {
    install();
    *write(&PROCESS_SINK) = sink;
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

fn sink_of(node: Option<u64>) -> Option<Arc<dyn Sink>> {
    match node {
        Some(n) => ROUTES.read().unwrap_or_else(|p| p.into_inner()).get(&n).cloned(),
        None => PROCESS_SINK.read().unwrap_or_else(|p| p.into_inner()).clone(),
    }
}

/// Installs the process-wide subscriber, [`Process`] (once). If the host
/// set one before, that one stays and gets the events (see the module
/// doc). Called by every new [`Logger`] and every transaction run, so that
/// the store's counters count before any node starts; after the first
/// call it costs one atomic load.
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = tracing::subscriber::set_global_default(Process);
    });
}

/// The process's own subscriber: the events of [`TARGET`] go to their
/// sinks (as [`Forward`] hands them), and the store's `transaction` span
/// to the counters (as [`Count`] adds it up); nothing else is on.
///
/// *Why not a registry with those two layers.* The transaction span is on
/// for every transaction, and a registry stores each span, looks it up
/// again on every enter, exit and record, and frees it at its close: about
/// 1,900 instructions more per read-only transaction, against about 600
/// here (bench/RESULTS.md, "the store's counters from the transaction
/// span"). Neither consumer needs what a registry keeps: an event names
/// its sink itself (`node`), and a transaction records its whole tally in
/// one record, so nothing is kept per span. A host that wants spans with
/// their context stacks [`forward()`] and [`count()`] on a registry of its
/// own.
pub struct Process;

static NEXT_SPAN: AtomicU64 = AtomicU64::new(1);

fn wanted(meta: &Metadata<'_>) -> bool {
    meta.target() == TARGET && (meta.is_event() || counts_from(meta))
}

impl Subscriber for Process {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if wanted(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        wanted(meta)
    }

    fn new_span(&self, _span: &Attributes<'_>) -> Id {
        // Unique while the span lives, as the contract asks; never looked
        // up, since nothing is kept per span.
        Id::from_u64(NEXT_SPAN.fetch_add(1, Ordering::Relaxed))
    }

    fn record(&self, _span: &Id, values: &Record<'_>) {
        add_tally(values);
    }

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, event: &TracingEvent<'_>) {
        deliver(event);
    }

    fn enter(&self, _span: &Id) {}

    fn exit(&self, _span: &Id) {}
}

/// The forwarding layer, filtered to the events of [`TARGET`] (a filter of
/// its own, so that a layer stacked beside it may still enable spans).
pub fn forward<S>() -> Filtered<Forward, impl tracing_subscriber::layer::Filter<S>, S>
where
    S: Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    Forward.with_filter(filter_fn(|m: &Metadata<'_>| m.is_event() && m.target() == TARGET))
}

/// The layer that hands couch_workers' `tracing` events to their sinks.
pub struct Forward;

impl<S: Subscriber> Layer<S> for Forward {
    fn on_event(&self, event: &TracingEvent<'_>, _ctx: Context<'_, S>) {
        deliver(event);
    }
}

/// The counting layer, filtered to the retry loop's `transaction` span
/// (a filter of its own: the forwarder beside it wants events only).
pub fn count<S>() -> Filtered<Count, impl tracing_subscriber::layer::Filter<S>, S>
where
    S: Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    Count.with_filter(filter_fn(|m: &Metadata<'_>| m.target() == TARGET && counts_from(m)))
}

/// Whether `meta` (of [`TARGET`]) is the span [`Count`] reads.
fn counts_from(meta: &Metadata<'_>) -> bool {
    meta.is_span() && meta.name() == "transaction"
}

/// The layer that adds each `transaction` span's tally to the store's
/// counters (`metrics::STORE`). It keeps nothing per span: the loop
/// records each field of its tally once per run, so adding a field's
/// value as it is recorded counts it once.
pub struct Count;

impl<S: Subscriber> Layer<S> for Count {
    fn on_record(&self, _span: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        add_tally(values);
    }
}

/// Adds a recorded tally of a `transaction` span to the store's counters
/// ([`Process`] calls it too).
fn add_tally(values: &Record<'_>) {
    values.record(&mut AddTally);
}

/// Adds the recorded fields of a tally to their counters.
struct AddTally;

impl Visit for AddTally {
    fn record_u64(&mut self, field: &Field, value: u64) {
        let counter = match field.name() {
            "attempts" => &STORE.transactions,
            "conflicts" => &STORE.conflicts,
            "retries" => &STORE.retries,
            _ => return,
        };
        counter.fetch_add(value, Ordering::Relaxed);
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "outcome" && value != COMMITTED {
            STORE.failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn record_debug(&mut self, _field: &Field, _value: &dyn fmt::Debug) {}
}

/// Hands one event to the sink of the route its `node` names.
fn deliver(event: &TracingEvent<'_>) {
    let mut fields = Fields::default();
    event.record(&mut fields);
    let Some(sink) = sink_of(fields.node) else { return };
    let meta = event.metadata();
    sink.log(Event { level: Level::of(meta.level(), fields.notice), what: meta.name(), fields: fields.rest });
}

/// An event's fields, read back: the route, the notice flag, the rest.
#[derive(Default)]
struct Fields {
    node: Option<u64>,
    notice: bool,
    rest: Vec<(&'static str, Value)>,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "node" {
            self.node = Some(value);
        } else {
            self.rest.push((field.name(), Value::Int(i64::try_from(value).unwrap_or(i64::MAX))));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.rest.push((field.name(), Value::Int(value)));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if field.name() == "notice" {
            self.notice = value;
        } else {
            self.rest.push((field.name(), Value::Str(value.to_string())));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.rest.push((field.name(), Value::Str(value.to_string())));
    }

    fn record_bytes(&mut self, field: &Field, value: &[u8]) {
        self.rest.push((field.name(), Value::Bytes(value.to_vec())));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // `%x` fields arrive here, Display-formatted through their Debug.
        self.rest.push((field.name(), Value::Str(format!("{value:?}"))));
    }
}

/// A sink that keeps every event, for the crate's unit tests.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct Collect(std::sync::Mutex<Vec<Event>>);

#[cfg(test)]
impl Sink for Collect {
    fn log(&self, event: Event) {
        self.0.lock().unwrap().push(event);
    }
}

#[cfg(test)]
impl Collect {
    /// The events so far, leaving none.
    pub(crate) fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }

    /// The events named `what` so far, kept.
    pub(crate) fn named(&self, what: &str) -> Vec<Event> {
        self.0.lock().unwrap().iter().filter(|e| e.what == what).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_reach_their_nodes_sink_with_their_levels_and_field_kinds() {
        let (a, b) = (Arc::new(Collect::default()), Arc::new(Collect::default()));
        let (log_a, log_b) = (Logger::new(a.clone()), Logger::new(b.clone()));
        let id = b"w-1".to_vec();
        // From another thread, as a runtime's worker would log.
        let l = log_a.clone();
        std::thread::spawn(move || {
            log_event!(l, Notice, "worker_reaped", "type" = b"idx".as_slice(), id = id.as_slice(), jobs = 2usize);
        })
        .join()
        .unwrap();
        log_event!(log_b, Warning, "reap_failed", reason = %"store busy", failures = 3u32);
        log_event!(log_b, Debug, "accept_watch_deferred");
        log_event!(log_b, Info, "job_released");
        log_event!(log_b, Error, "rust_panic", message = "boom");
        assert_eq!(
            a.take(),
            vec![Event {
                level: Level::Notice,
                what: "worker_reaped",
                fields: vec![
                    ("type", Value::Bytes(b"idx".to_vec())),
                    ("id", Value::Bytes(b"w-1".to_vec())),
                    ("jobs", Value::Int(2))
                ],
            }]
        );
        let got: Vec<_> = b.take().into_iter().map(|e| (e.level, e.what, e.fields)).collect();
        assert_eq!(
            got,
            vec![
                (
                    Level::Warning,
                    "reap_failed",
                    vec![("reason", Value::Str("store busy".into())), ("failures", Value::Int(3))]
                ),
                (Level::Debug, "accept_watch_deferred", vec![]),
                (Level::Info, "job_released", vec![]),
                (Level::Error, "rust_panic", vec![("message", Value::Str("boom".into()))]),
            ]
        );
    }

    /// With the process's own subscriber, a span is off at its call site
    /// (what makes the heartbeat, reap and accept-round spans free) except
    /// the store's `transaction` span, which the counting layer takes; and
    /// events still reach their sinks.
    #[test]
    fn only_the_transaction_span_is_on_with_the_process_subscriber() {
        let sink = Arc::new(Collect::default());
        let log = Logger::new(sink.clone());
        for _ in 0..2 {
            // The second time through, the call sites' cached interest.
            let span = tracing::debug_span!(target: TARGET, "heartbeat", workers = tracing::field::Empty);
            assert!(span.is_disabled());
            let counted = tracing::debug_span!(target: TARGET, "transaction", attempts = tracing::field::Empty);
            assert!(!counted.is_disabled());
            let _in = span.enter();
            log_event!(log, Notice, "store_opened");
        }
        assert_eq!(sink.take().len(), 2);
    }

    #[test]
    fn a_dropped_loggers_events_go_nowhere() {
        let sink = Arc::new(Collect::default());
        let log = Logger::new(sink.clone());
        let node = log.node();
        let clone = log.clone();
        drop(log);
        log_event!(clone, Notice, "store_closed");
        assert_eq!(sink.take().len(), 1, "a clone keeps the route");
        drop(clone);
        assert!(sink_of(node).is_none(), "the route is removed with its last clone");
        assert_eq!(Arc::strong_count(&sink), 1, "and the sink released");
    }
}
