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
//! The conversion is bounded twice:
//!
//! * in bytes: it keeps a lower bound of the encoded size and stops with
//!   [`JsonError::TooLarge`] as soon as that passes the caller's limit
//!   (the store's value limit), so a huge term costs no more than a legal
//!   one;
//! * in time, on a normal scheduler ([`Sched::Normal`]): the byte limit
//!   still allows 100 KB of small terms (a list of 49,000 integers, a map
//!   of 8,000 keys: milliseconds to convert), and a NIF never holds a
//!   normal scheduler that long (figures for this module: bench/RESULTS.md,
//!   "Figures the module docs rely on"). So it visits at most [`NORMAL_MAX_NODES`] terms there (a
//!   binary counts one more for every [`BYTES_PER_NODE`] bytes) and then
//!   gives up with [`JsonError::NeedsDirty`].
//!
//! The NIFs that take a caller's map ([`map_arg`]: `job_add/5`,
//! `job_update/3`, `job_finish/3`, `worker_register/4`) therefore come in
//! twins, declared together by [`budgeted_nif!`]: the NIF itself runs on
//! the calling scheduler with the node budget and, when that runs out,
//! answers the atom `dirty` at once, having done nothing (nothing sent,
//! written or logged); its `_dirty` twin runs on a dirty CPU scheduler
//! with only the byte and depth limits. `couch_workers_nif:budgeted/2`
//! calls the one and, on `dirty`, the other with the same arguments. The
//! conversion visits the term in the same order in both, so both answer
//! alike (`badarg`, `invalid_info`, `value_too_large`, ...): an error
//! found within the budget is the first error of the term either way.
//! Small terms (nearly all) stay on the fast path; a call of a dirty
//! twin costs tens of microseconds more.
//!
//! JSON to terms (what the store gives back): objects become maps with
//! **binary** keys, strings binaries, numbers integers or floats,
//! true/false/null atoms, arrays lists.

use couch_workers_core::MAX_VALUE_SIZE;
use rustler::{Atom, Binary, Encoder, Env, Error, NifResult, Term, TermType};
use serde_json::{Map, Number, Value};

use crate::atoms;
use crate::term::{binary, error_tuple};

/// Most nested containers (maps, lists) in one value.
pub const MAX_DEPTH: usize = 64;

/// Most terms (values and map keys) one conversion visits on a normal
/// scheduler: even 2,000 of the dearest kind (an atom other than
/// true/false/null in a list) stay well under the 1 ms a NIF may hold a
/// scheduler. Beyond it the conversion belongs on a dirty scheduler.
pub const NORMAL_MAX_NODES: usize = 2_000;

/// The bytes of a binary (a string or a key) that count as one more term
/// against [`NORMAL_MAX_NODES`]: 16 bytes that need escaping cost about
/// one term. So strings of up to 32 KB in all stay on a normal scheduler,
/// and a 99 KB one goes to a dirty one.
pub const BYTES_PER_NODE: usize = 16;

/// Where a conversion runs, which bounds its work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sched {
    /// On the calling normal scheduler: at most [`NORMAL_MAX_NODES`]
    /// terms, else [`JsonError::NeedsDirty`].
    Normal,
    /// On a dirty CPU scheduler: the byte and depth limits only.
    Dirty,
}

/// Why a term is not JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    /// More than [`MAX_DEPTH`] nested containers.
    #[error("nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
    /// The encoded JSON would be longer than the limit.
    #[error("larger than the value limit once encoded")]
    TooLarge,
    /// More than [`NORMAL_MAX_NODES`] terms on a normal scheduler: not an
    /// error of the term, convert it again on a dirty one.
    #[error("more than {NORMAL_MAX_NODES} terms for a normal scheduler")]
    NeedsDirty,
    /// A binary that is not UTF-8 (path of the value).
    #[error("binary at {0} is not valid UTF-8")]
    InvalidUtf8(String),
    /// An integer outside i64 and u64.
    #[error("integer at {0} does not fit 64 bits")]
    IntegerOutOfRange(String),
    /// A map key that is neither a binary nor an atom.
    #[error("map key at {0} is neither a binary nor an atom")]
    BadKey(String),
    /// The same key twice (as atom and as binary).
    #[error("key {0} given twice (as atom and binary)")]
    DuplicateKey(String),
    /// A term with no JSON form: what it is, and where.
    #[error("{0} at {1} has no JSON form")]
    Unsupported(&'static str, String),
}

/// Converts `term` to JSON; refuses it once its encoding would exceed
/// `max_bytes`, and on [`Sched::Normal`] once it has visited
/// [`NORMAL_MAX_NODES`] terms.
pub fn term_to_json(term: Term, max_bytes: usize, sched: Sched) -> Result<Value, JsonError> {
    let nodes = match sched {
        Sched::Normal => NORMAL_MAX_NODES,
        Sched::Dirty => usize::MAX,
    };
    let mut conv = ToJson { budget: max_bytes, nodes, path: Vec::new() };
    conv.value(term, 0)
}

/// Converts a map term to a JSON object (the options of a worker, the info
/// of a job). `None` when `term` is no map.
pub fn map_to_json(term: Term, max_bytes: usize, sched: Sched) -> Option<Result<Map<String, Value>, JsonError>> {
    if !term.is_map() {
        return None;
    }
    Some(term_to_json(term, max_bytes, sched).map(|v| match v {
        Value::Object(m) => m,
        _ => unreachable!("a map converts to an object"),
    }))
}

/// A caller's map argument (a job's info or result, a worker's options)
/// as a JSON object within the store's value limit, converted as `sched`
/// allows; or what the NIF answers at once, having done nothing:
///
/// * `badarg` when `term` is no map;
/// * `dirty` when the node budget of [`Sched::Normal`] ran out (the
///   caller then calls the NIF's `_dirty` twin);
/// * `{error, value_too_large}`;
/// * `{error, Invalid}` for a map JSON cannot hold, after
///   `log_invalid(&why)`.
pub fn map_arg<'a>(
    env: Env<'a>,
    term: Term<'a>,
    sched: Sched,
    invalid: Atom,
    log_invalid: impl FnOnce(&JsonError),
) -> Result<Map<String, Value>, NifResult<Term<'a>>> {
    match map_to_json(term, MAX_VALUE_SIZE, sched) {
        None => Err(Err(Error::BadArg)),
        Some(Ok(map)) => Ok(map),
        Some(Err(JsonError::NeedsDirty)) => Err(Ok(atoms::dirty().encode(env))),
        Some(Err(JsonError::TooLarge)) => Err(Ok(error_tuple(env, "value_too_large"))),
        Some(Err(e)) => {
            log_invalid(&e);
            Err(Ok((atoms::error(), invalid).encode(env)))
        }
    }
}

/// Declares the twins of a NIF that converts a caller's map with
/// [`map_arg`]: `$normal` on the calling scheduler ([`Sched::Normal`],
/// may answer `dirty`) and `$dirty` on a dirty CPU scheduler
/// ([`Sched::Dirty`]). Both call `$body(env, args..., sched)`, which
/// holds the NIF's whole logic: the two answer alike but for `dirty`.
macro_rules! budgeted_nif {
    ($normal:ident, $dirty:ident, $body:ident($($arg:ident),*)) => {
        // An Erlang arity of seven and the environment make eight.
        #[allow(clippy::too_many_arguments)]
        #[rustler::nif]
        fn $normal<'a>(env: Env<'a>, $($arg: Term<'a>),*) -> NifResult<Term<'a>> {
            $body(env, $($arg,)* $crate::json::Sched::Normal)
        }

        #[allow(clippy::too_many_arguments)]
        #[rustler::nif(schedule = "DirtyCpu")]
        fn $dirty<'a>(env: Env<'a>, $($arg: Term<'a>),*) -> NifResult<Term<'a>> {
            $body(env, $($arg,)* $crate::json::Sched::Dirty)
        }
    };
}
pub(crate) use budgeted_nif;

struct ToJson {
    /// Bytes of encoded JSON still allowed.
    budget: usize,
    /// Terms still allowed to visit (see [`Sched`]).
    nodes: usize,
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

    /// Counts `n` more terms visited.
    fn visit(&mut self, n: usize) -> Result<(), JsonError> {
        self.nodes = self.nodes.checked_sub(n).ok_or(JsonError::NeedsDirty)?;
        Ok(())
    }

    fn value(&mut self, term: Term, depth: usize) -> Result<Value, JsonError> {
        self.visit(1)?;
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

    fn string(&mut self, term: Term) -> Result<String, JsonError> {
        let bin: Binary = term.decode().map_err(|_| JsonError::Unsupported("bitstring", self.at()))?;
        // Checked, copied and (once converted) escaped byte by byte.
        self.visit(bin.len() / BYTES_PER_NODE)?;
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
            self.visit(1)?;
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
