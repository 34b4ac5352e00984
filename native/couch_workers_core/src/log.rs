//! Log events. The core never prints: it hands structured events to a
//! sink, and the NIF forwards them to an Erlang process that calls
//! `logger` with a map such as `#{what => heartbeat_failed, type => T}`.

use std::sync::Arc;

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
}

/// A field value of a log event.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Bytes(Vec<u8>),
    Str(String),
    Int(i64),
}

impl From<&[u8]> for Value {
    fn from(v: &[u8]) -> Self {
        Value::Bytes(v.to_vec())
    }
}
impl From<&Vec<u8>> for Value {
    fn from(v: &Vec<u8>) -> Self {
        Value::Bytes(v.clone())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Str(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Str(v.to_string())
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}
impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}
impl From<usize> for Value {
    fn from(v: usize) -> Self {
        Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}

/// One structured event: `what` names it, `fields` say the rest.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub level: Level,
    pub what: &'static str,
    pub fields: Vec<(&'static str, Value)>,
}

impl Event {
    pub fn new(level: Level, what: &'static str) -> Self {
        Event { level, what, fields: Vec::new() }
    }

    pub fn with(mut self, key: &'static str, value: impl Into<Value>) -> Self {
        self.fields.push((key, value.into()));
        self
    }
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

pub type Logger = Arc<dyn Sink>;
