//! Erlang terms ⇄ JSON (`serde_json::Value`).
//!
//! Terms to JSON (what callers give: worker options, later job info):
//!
//! | term                                   | JSON            |
//! | -------------------------------------- | --------------- |
//! | map with binary or atom keys           | object          |
//! | binary (valid UTF-8)                   | string          |
//! | integer in i64 or u64 range            | number          |
//! | float                                  | number          |
//! | `true`, `false`, `null`                | true/false/null |
//! | any other atom                         | string          |
//! | proper list                            | array           |
//!
//! Anything else (a pid, a reference, a tuple, a fun, a port, a bigger
//! integer, a bitstring, an improper list, a map key that is neither
//! binary nor atom, the same key as atom and binary) is refused with a
//! [`JsonError`] that says what and where. Nesting is limited to
//! [`MAX_DEPTH`] containers.
//!
//! The conversion runs on the calling scheduler, so it is bounded: it
//! keeps a lower bound of the encoded size and stops with
//! [`JsonError::TooLarge`] as soon as that passes the caller's limit (the
//! store's value limit), so a huge term costs no more than a legal one.
//!
//! JSON to terms (what the store gives back): objects become maps with
//! **binary** keys, strings binaries, numbers integers or floats,
//! true/false/null atoms, arrays lists.

use rustler::{Binary, Encoder, Env, Term, TermType};
use serde_json::{Map, Number, Value};

use crate::atoms;
use crate::term::binary;

/// Most nested containers (maps, lists) in one value.
pub const MAX_DEPTH: usize = 64;

/// Why a term is not JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonError {
    /// More than [`MAX_DEPTH`] nested containers.
    TooDeep,
    /// The encoded JSON would be longer than the limit.
    TooLarge,
    /// A binary that is not UTF-8 (path of the value).
    InvalidUtf8(String),
    /// An integer outside i64 and u64.
    IntegerOutOfRange(String),
    /// A map key that is neither a binary nor an atom.
    BadKey(String),
    /// The same key twice (as atom and as binary).
    DuplicateKey(String),
    /// A term with no JSON form: what it is, and where.
    Unsupported(&'static str, String),
}

impl std::fmt::Display for JsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JsonError::TooDeep => write!(f, "nested deeper than {MAX_DEPTH} levels"),
            JsonError::TooLarge => write!(f, "larger than the value limit once encoded"),
            JsonError::InvalidUtf8(at) => write!(f, "binary at {at} is not valid UTF-8"),
            JsonError::IntegerOutOfRange(at) => write!(f, "integer at {at} does not fit 64 bits"),
            JsonError::BadKey(at) => write!(f, "map key at {at} is neither a binary nor an atom"),
            JsonError::DuplicateKey(at) => write!(f, "key {at} given twice (as atom and binary)"),
            JsonError::Unsupported(what, at) => write!(f, "{what} at {at} has no JSON form"),
        }
    }
}

/// Converts `term` to JSON; refuses it once its encoding would exceed
/// `max_bytes`.
pub fn term_to_json(term: Term, max_bytes: usize) -> Result<Value, JsonError> {
    let mut conv = ToJson { budget: max_bytes, path: Vec::new() };
    conv.value(term, 0)
}

/// Converts a map term to a JSON object (the options of a worker, the info
/// of a job). `None` when `term` is no map.
pub fn map_to_json(term: Term, max_bytes: usize) -> Option<Result<Map<String, Value>, JsonError>> {
    if !term.is_map() {
        return None;
    }
    Some(term_to_json(term, max_bytes).map(|v| match v {
        Value::Object(m) => m,
        _ => unreachable!("a map converts to an object"),
    }))
}

struct ToJson {
    /// Bytes of encoded JSON still allowed.
    budget: usize,
    /// Where we are, for error messages: keys and list indexes.
    path: Vec<String>,
}

impl ToJson {
    fn at(&self) -> String {
        if self.path.is_empty() {
            "the top".to_string()
        } else {
            self.path.join(".")
        }
    }

    fn spend(&mut self, bytes: usize) -> Result<(), JsonError> {
        self.budget = self.budget.checked_sub(bytes).ok_or(JsonError::TooLarge)?;
        Ok(())
    }

    fn value(&mut self, term: Term, depth: usize) -> Result<Value, JsonError> {
        match term.get_type() {
            TermType::Map => self.object(term, depth + 1),
            TermType::List => self.array(term, depth + 1),
            TermType::Binary => {
                let s = self.string(term)?;
                self.spend(s.len() + 2)?;
                Ok(Value::String(s))
            }
            TermType::Integer => {
                let n = if let Ok(i) = term.decode::<i64>() {
                    Number::from(i)
                } else if let Ok(u) = term.decode::<u64>() {
                    Number::from(u)
                } else {
                    return Err(JsonError::IntegerOutOfRange(self.at()));
                };
                self.spend(1)?;
                Ok(Value::Number(n))
            }
            TermType::Float => {
                let f: f64 = term.decode().map_err(|_| JsonError::Unsupported("float", self.at()))?;
                // Erlang floats are always finite.
                let n = Number::from_f64(f).ok_or_else(|| JsonError::Unsupported("non-finite float", self.at()))?;
                self.spend(1)?;
                Ok(Value::Number(n))
            }
            TermType::Atom => {
                let v = if term == atoms::true_().to_term(term.get_env()) {
                    Value::Bool(true)
                } else if term == atoms::false_().to_term(term.get_env()) {
                    Value::Bool(false)
                } else if term == atoms::null().to_term(term.get_env()) {
                    Value::Null
                } else {
                    let name = term.atom_to_string().map_err(|_| JsonError::Unsupported("atom", self.at()))?;
                    Value::String(name)
                };
                self.spend(match &v {
                    Value::String(s) => s.len() + 2,
                    _ => 4,
                })?;
                Ok(v)
            }
            TermType::Tuple => Err(JsonError::Unsupported("tuple", self.at())),
            TermType::Pid => Err(JsonError::Unsupported("pid", self.at())),
            TermType::Ref => Err(JsonError::Unsupported("reference", self.at())),
            TermType::Fun => Err(JsonError::Unsupported("fun", self.at())),
            TermType::Port => Err(JsonError::Unsupported("port", self.at())),
            TermType::Unknown => Err(JsonError::Unsupported("term", self.at())),
        }
    }

    fn string(&self, term: Term) -> Result<String, JsonError> {
        let bin: Binary = term.decode().map_err(|_| JsonError::Unsupported("bitstring", self.at()))?;
        std::str::from_utf8(bin.as_slice()).map(str::to_owned).map_err(|_| JsonError::InvalidUtf8(self.at()))
    }

    fn object(&mut self, term: Term, depth: usize) -> Result<Value, JsonError> {
        if depth > MAX_DEPTH {
            return Err(JsonError::TooDeep);
        }
        let size = term.map_size().unwrap_or(0);
        // "{}" plus a comma between entries.
        self.spend(2 + size.saturating_sub(1))?;
        let iter = rustler::MapIterator::new(term).ok_or_else(|| JsonError::Unsupported("map", self.at()))?;
        let mut map = Map::with_capacity(size);
        for (key, value) in iter {
            let key = match key.get_type() {
                TermType::Binary => self.string(key)?,
                TermType::Atom => key.atom_to_string().map_err(|_| JsonError::BadKey(self.at()))?,
                _ => return Err(JsonError::BadKey(self.at())),
            };
            // "key": (quotes and colon)
            self.spend(key.len() + 3)?;
            if map.contains_key(&key) {
                return Err(JsonError::DuplicateKey(key));
            }
            self.path.push(key.clone());
            let v = self.value(value, depth)?;
            self.path.pop();
            map.insert(key, v);
        }
        Ok(Value::Object(map))
    }

    fn array(&mut self, term: Term, depth: usize) -> Result<Value, JsonError> {
        if depth > MAX_DEPTH {
            return Err(JsonError::TooDeep);
        }
        self.spend(2)?;
        let mut items = Vec::new();
        let mut rest = term;
        let mut index = 0usize;
        while !rest.is_empty_list() {
            let Ok((head, tail)) = rest.list_get_cell() else {
                return Err(JsonError::Unsupported("improper list", self.at()));
            };
            if index > 0 {
                self.spend(1)?;
            }
            self.path.push(index.to_string());
            items.push(self.value(head, depth)?);
            self.path.pop();
            rest = tail;
            index += 1;
        }
        Ok(Value::Array(items))
    }
}

/// Converts JSON to a term: objects become maps with binary keys.
pub fn json_to_term<'a>(env: Env<'a>, value: &Value) -> Term<'a> {
    match value {
        Value::Null => atoms::null().encode(env),
        Value::Bool(true) => atoms::true_().encode(env),
        Value::Bool(false) => atoms::false_().encode(env),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.encode(env)
            } else if let Some(u) = n.as_u64() {
                u.encode(env)
            } else {
                n.as_f64().unwrap_or(0.0).encode(env)
            }
        }
        Value::String(s) => binary(env, s.as_bytes()),
        Value::Array(items) => {
            let terms: Vec<Term<'a>> = items.iter().map(|v| json_to_term(env, v)).collect();
            terms.encode(env)
        }
        Value::Object(map) => {
            let keys: Vec<Term<'a>> = map.keys().map(|k| binary(env, k.as_bytes())).collect();
            let values: Vec<Term<'a>> = map.values().map(|v| json_to_term(env, v)).collect();
            // Keys of a JSON object are unique.
            make_map(env, &keys, &values)
        }
    }
}

/// Most keys of a flatmap (ERTS's `MAP_SMALL_MAP_LIMIT`); bigger maps are
/// hashmaps.
const FLATMAP_MAX_KEYS: usize = 32;

/// The map of `keys` (distinct) to `values`.
///
/// These terms are built in process-independent environments on the
/// runtime's threads, not on a scheduler. There, on OTP 25.2.3 (erts
/// 13.1.5, Debian 12's), `enif_make_map_from_arrays` segfaults the VM for
/// more than 128 keys, while `enif_make_map_put` does not (checked with a
/// C NIF up to 60,000 keys; see test/couch_workers_bigmap_tests.erl; most
/// likely erlang/otp#8208: hashmap building that assumes a scheduler). So
/// only flatmaps are built from arrays; bigger maps one key at a time.
pub fn make_map<'a>(env: Env<'a>, keys: &[Term<'a>], values: &[Term<'a>]) -> Term<'a> {
    if keys.len() <= FLATMAP_MAX_KEYS {
        if let Ok(map) = Term::map_from_term_arrays(env, keys, values) {
            return map;
        }
    }
    let mut map = rustler::types::map::map_new(env);
    for (key, value) in keys.iter().zip(values) {
        map = map.map_put(*key, *value).unwrap_or(map);
    }
    map
}

/// Decodes stored JSON bytes to a term; bytes that are not JSON (a record
/// written by something else) become the binary itself.
pub fn json_bytes_to_term<'a>(env: Env<'a>, bytes: &[u8]) -> Term<'a> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(v) => json_to_term(env, &v),
        Err(_) => binary(env, bytes),
    }
}
