//! A transaction's buffered writes: read-your-writes over the cluster's
//! values, the ranges a versionstamped operation makes unreadable
//! (`accessed_unreadable`, 1036), write conflict ranges, and the size
//! FoundationDB counts towards its limits.
//!
//! As FoundationDB's client (`ReadYourWrites.actor.cpp`) does:
//!
//! * a key over [`MAX_KEY_SIZE`] or a value over [`MAX_VALUE_SIZE`] fails the
//!   write, counting a versionstamped parameter with its 4-byte offset;
//! * every mutation adds a write conflict range, except a versionstamped
//!   key (its final key is unknown until the commit);
//! * a versionstamped key makes the range of every key it could become
//!   unreadable (from the placeholder filled with the read version to the
//!   placeholder filled with `0xff`); a versionstamped value makes its key
//!   unreadable until the transaction clears it (setting it again does
//!   not: FoundationDB 7.1 still refuses the read);
//! * a read refused so fails the transaction: its commit answers
//!   `accessed_unreadable` too (`transaction.rs`);
//! * the transaction size is the mutations' keys and values plus the
//!   coalesced read and write conflict ranges' keys.

use super::conflicts::{key_after, RangeSet};
use crate::store::mutation::{add_le_i64, byte_max, fill_versionstamp, split_versionstamp_param};
use crate::store::{KeyValue, StoreError, Versionstamp, MAX_KEY_SIZE, MAX_VALUE_SIZE, VERSIONSTAMP_LEN};

/// One buffered mutation, in the order the transaction made it.
#[derive(Debug, Clone)]
pub(super) enum Mutation {
    Set(Vec<u8>, Vec<u8>),
    Clear(Vec<u8>),
    ClearRange(Vec<u8>, Vec<u8>),
    Add(Vec<u8>, i64),
    ByteMax(Vec<u8>, Vec<u8>),
    /// The key parameter (placeholder, offset checked) and its value.
    StampKey {
        key: Vec<u8>,
        offset: usize,
        value: Vec<u8>,
    },
    /// The key and the value parameter (placeholder, offset checked).
    StampValue {
        key: Vec<u8>,
        value: Vec<u8>,
        offset: usize,
    },
}

/// What a read of one key learns from the buffer.
enum Own {
    /// The buffer says nothing about the key.
    Untouched,
    /// The transaction's writes decide the value without the stored one
    /// (a set or a clear last): FDB adds no read conflict for it.
    Independent(Option<Vec<u8>>),
    /// The value depends on the stored one (atomic operations over it,
    /// in order).
    Atomics(Vec<Atomic>),
    Unreadable,
}

/// An atomic operation over the stored value.
#[derive(Clone)]
enum Atomic {
    Add(i64),
    ByteMax(Vec<u8>),
}

impl Atomic {
    fn apply(&self, v: Option<Vec<u8>>) -> Vec<u8> {
        match self {
            Atomic::Add(d) => add_le_i64(v.as_deref(), *d).to_vec(),
            Atomic::ByteMax(operand) => byte_max(v.as_deref(), operand),
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct Writes {
    mutations: Vec<Mutation>,
    /// Ranges a versionstamped key may land in.
    unreadable: Vec<(Vec<u8>, Vec<u8>)>,
    conflicts: RangeSet,
    /// Keys and values of the mutations, as FDB counts them.
    mutation_bytes: usize,
}

fn accessed_unreadable() -> StoreError {
    StoreError::accessed_unreadable()
}

fn check_key(key: &[u8]) -> Result<(), StoreError> {
    if key.len() > MAX_KEY_SIZE {
        return Err(StoreError::KeyTooLarge);
    }
    Ok(())
}

fn check_value(value: &[u8]) -> Result<(), StoreError> {
    if value.len() > MAX_VALUE_SIZE {
        return Err(StoreError::ValueTooLarge);
    }
    Ok(())
}

impl Own {
    /// `self` followed by the atomic operation `op` on the same key.
    fn then(self, op: Atomic) -> Own {
        match self {
            Own::Untouched => Own::Atomics(vec![op]),
            Own::Atomics(mut ops) => {
                ops.push(op);
                Own::Atomics(ops)
            }
            Own::Independent(v) => Own::Independent(Some(op.apply(v))),
            Own::Unreadable => Own::Unreadable,
        }
    }
}

fn in_range(key: &[u8], begin: &[u8], end: &[u8]) -> bool {
    begin <= key && key < end
}

impl Writes {
    pub(super) fn is_empty(&self) -> bool {
        self.mutations.is_empty() && self.conflicts.is_empty()
    }

    pub(super) fn mutations(&self) -> &[Mutation] {
        &self.mutations
    }

    pub(super) fn conflicts(&self) -> &RangeSet {
        &self.conflicts
    }

    /// Bytes towards FDB's transaction size limit, with `reads` (the read
    /// conflict ranges).
    pub(super) fn size(&self, reads: &RangeSet) -> usize {
        self.mutation_bytes + self.conflicts.byte_size() + reads.byte_size()
    }

    fn push(&mut self, mutation: Mutation, bytes: usize) {
        self.mutation_bytes += bytes;
        self.mutations.push(mutation);
    }

    pub(super) fn set(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        check_key(key)?;
        check_value(value)?;
        self.conflicts.add_key(key);
        self.push(Mutation::Set(key.to_vec(), value.to_vec()), key.len() + value.len());
        Ok(())
    }

    pub(super) fn clear(&mut self, key: &[u8]) {
        // FDB ignores a clear of a key too long to exist.
        if key.len() > MAX_KEY_SIZE {
            return;
        }
        let end = key_after(key);
        self.conflicts.add(key, &end);
        self.push(Mutation::Clear(key.to_vec()), key.len() + end.len());
    }

    pub(super) fn clear_range(&mut self, begin: &[u8], end: &[u8]) {
        if begin >= end {
            return;
        }
        self.conflicts.add(begin, end);
        self.push(Mutation::ClearRange(begin.to_vec(), end.to_vec()), begin.len() + end.len());
    }

    pub(super) fn add(&mut self, key: &[u8], delta: i64) -> Result<(), StoreError> {
        check_key(key)?;
        self.conflicts.add_key(key);
        self.push(Mutation::Add(key.to_vec(), delta), key.len() + 8);
        Ok(())
    }

    pub(super) fn byte_max(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        check_key(key)?;
        check_value(value)?;
        self.conflicts.add_key(key);
        self.push(Mutation::ByteMax(key.to_vec(), value.to_vec()), key.len() + value.len());
        Ok(())
    }

    /// `read_version`: the transaction's, if it has one yet (the lowest
    /// versionstamp the key can get; FDB uses 0 before the first read).
    pub(super) fn set_versionstamped_key(
        &mut self,
        param: &[u8],
        value: &[u8],
        read_version: Option<u64>,
    ) -> Result<(), StoreError> {
        check_key(param)?;
        check_value(value)?;
        let (bytes, offset) = split_versionstamp_param(param)?;
        let mut low = [0u8; VERSIONSTAMP_LEN];
        low[..8].copy_from_slice(&read_version.unwrap_or(0).to_be_bytes());
        let begin = fill_versionstamp(bytes, offset, &low);
        let end = key_after(&fill_versionstamp(bytes, offset, &[0xff; VERSIONSTAMP_LEN]));
        self.unreadable.push((begin, end));
        let mutation = Mutation::StampKey { key: bytes.to_vec(), offset, value: value.to_vec() };
        self.push(mutation, param.len() + value.len());
        Ok(())
    }

    pub(super) fn set_versionstamped_value(&mut self, key: &[u8], param: &[u8]) -> Result<(), StoreError> {
        check_key(key)?;
        check_value(param)?;
        let (bytes, offset) = split_versionstamp_param(param)?;
        self.conflicts.add_key(key);
        let mutation = Mutation::StampValue { key: key.to_vec(), value: bytes.to_vec(), offset };
        self.push(mutation, key.len() + param.len());
        Ok(())
    }

    fn own(&self, key: &[u8]) -> Own {
        let mut own = Own::Untouched;
        for m in &self.mutations {
            own = match (m, own) {
                // Only a clear makes it readable again (FoundationDB 7.1).
                (Mutation::Set(k, _), Own::Unreadable) if k.as_slice() == key => Own::Unreadable,
                (Mutation::Set(k, v), _) if k.as_slice() == key => Own::Independent(Some(v.clone())),
                (Mutation::Clear(k), _) if k.as_slice() == key => Own::Independent(None),
                (Mutation::ClearRange(b, e), _) if in_range(key, b, e) => Own::Independent(None),
                (Mutation::StampValue { key: k, .. }, _) if k.as_slice() == key => Own::Unreadable,
                (Mutation::Add(k, d), prev) if k.as_slice() == key => prev.then(Atomic::Add(*d)),
                (Mutation::ByteMax(k, v), prev) if k.as_slice() == key => prev.then(Atomic::ByteMax(v.clone())),
                (_, prev) => prev,
            };
        }
        own
    }

    fn check_readable_key(&self, key: &[u8]) -> Result<(), StoreError> {
        if self.unreadable.iter().any(|(b, e)| in_range(key, b, e)) {
            return Err(accessed_unreadable());
        }
        Ok(())
    }

    /// Whether reading `key` needs a read conflict (FDB adds none when the
    /// transaction's own set or clear decides the value).
    pub(super) fn read_depends_on_store(&self, key: &[u8]) -> bool {
        !matches!(self.own(key), Own::Independent(_))
    }

    /// The value of `key` this transaction sees, given the stored one.
    pub(super) fn read(&self, key: &[u8], stored: Option<Vec<u8>>) -> Result<Option<Vec<u8>>, StoreError> {
        self.check_readable_key(key)?;
        match self.own(key) {
            Own::Untouched => Ok(stored),
            Own::Independent(v) => Ok(v),
            Own::Atomics(ops) => Ok(Some(ops.iter().fold(stored, |v, op| Some(op.apply(v))).unwrap_or_default())),
            Own::Unreadable => Err(accessed_unreadable()),
        }
    }

    /// Whether any buffered write could change what a read of
    /// `[begin, end)` returns.
    pub(super) fn touches(&self, begin: &[u8], end: &[u8]) -> bool {
        self.unreadable.iter().any(|(b, e)| b.as_slice() < end && begin < e.as_slice())
            || self.mutations.iter().any(|m| match m {
                Mutation::Set(k, _)
                | Mutation::Clear(k)
                | Mutation::Add(k, _)
                | Mutation::ByteMax(k, _)
                | Mutation::StampValue { key: k, .. } => in_range(k, begin, end),
                Mutation::ClearRange(b, e) => b.as_slice() < end && begin < e.as_slice(),
                Mutation::StampKey { .. } => false,
            })
    }

    /// A range read with this transaction's writes over the stored pairs
    /// `stored` (all of `[begin, end)`, forward): limit and direction
    /// applied after the merge.
    pub(super) fn read_range(
        &self,
        stored: Vec<KeyValue>,
        begin: &[u8],
        end: &[u8],
        limit: usize,
        reverse: bool,
    ) -> Result<Vec<KeyValue>, StoreError> {
        if self.unreadable.iter().any(|(b, e)| b.as_slice() < end && begin < e.as_slice()) {
            return Err(accessed_unreadable());
        }
        let mut keys: std::collections::BTreeMap<Vec<u8>, Option<Vec<u8>>> =
            stored.into_iter().map(|(k, v)| (k, Some(v))).collect();
        for m in &self.mutations {
            if let Mutation::Set(k, _)
            | Mutation::Add(k, _)
            | Mutation::ByteMax(k, _)
            | Mutation::StampValue { key: k, .. } = m
            {
                if in_range(k, begin, end) {
                    keys.entry(k.clone()).or_insert(None);
                }
            }
        }
        let mut out = Vec::new();
        for (k, stored) in keys {
            if let Some(v) = self.read(&k, stored)? {
                out.push((k, v));
            }
        }
        if reverse {
            out.reverse();
        }
        if limit > 0 {
            out.truncate(limit);
        }
        Ok(out)
    }
}

/// A mutation with the commit's versionstamp filled in.
pub(super) enum Applied {
    Set(Vec<u8>, Vec<u8>),
    Clear(Vec<u8>),
    ClearRange(Vec<u8>, Vec<u8>),
    Add(Vec<u8>, i64),
    ByteMax(Vec<u8>, Vec<u8>),
}

impl Mutation {
    pub(super) fn stamped(&self, stamp: &Versionstamp) -> Applied {
        match self {
            Mutation::Set(k, v) => Applied::Set(k.clone(), v.clone()),
            Mutation::Clear(k) => Applied::Clear(k.clone()),
            Mutation::ClearRange(b, e) => Applied::ClearRange(b.clone(), e.clone()),
            Mutation::Add(k, d) => Applied::Add(k.clone(), *d),
            Mutation::ByteMax(k, v) => Applied::ByteMax(k.clone(), v.clone()),
            Mutation::StampKey { key, offset, value } => {
                Applied::Set(fill_versionstamp(key, *offset, stamp), value.clone())
            }
            Mutation::StampValue { key, value, offset } => {
                Applied::Set(key.clone(), fill_versionstamp(value, *offset, stamp))
            }
        }
    }

    pub(super) fn is_versionstamped(&self) -> bool {
        matches!(self, Mutation::StampKey { .. } | Mutation::StampValue { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(before: &[u8]) -> Vec<u8> {
        let mut p = before.to_vec();
        p.extend_from_slice(&[0; VERSIONSTAMP_LEN]);
        p.extend_from_slice(&(before.len() as u32).to_le_bytes());
        p
    }

    #[test]
    fn sizes_count_the_versionstamp_offset() {
        let mut w = Writes::default();
        // A value of MAX_VALUE_SIZE - 4 bytes plus its offset fits ...
        let fits =
            [vec![0u8; MAX_VALUE_SIZE - 4 - VERSIONSTAMP_LEN], vec![0; VERSIONSTAMP_LEN], 0u32.to_le_bytes().to_vec()]
                .concat();
        assert_eq!(fits.len(), MAX_VALUE_SIZE);
        assert_eq!(w.set_versionstamped_value(b"k", &fits), Ok(()));
        // ... one byte more does not, though its value is under the limit.
        let over =
            [vec![0u8; MAX_VALUE_SIZE - 3 - VERSIONSTAMP_LEN], vec![0; VERSIONSTAMP_LEN], 0u32.to_le_bytes().to_vec()]
                .concat();
        assert_eq!(w.set_versionstamped_value(b"k", &over), Err(StoreError::ValueTooLarge));
        let key = param(&vec![b'k'; MAX_KEY_SIZE - 4 - VERSIONSTAMP_LEN + 1]);
        assert_eq!(w.set_versionstamped_key(&key, b"", None), Err(StoreError::KeyTooLarge));
    }

    #[test]
    fn transaction_size_counts_mutations_and_conflict_ranges() {
        let mut w = Writes::default();
        w.set(b"abc", b"12345").expect("set");
        // key + value, and the write conflict range [abc, abc\0).
        assert_eq!(w.size(&RangeSet::default()), 3 + 5 + 3 + 4);
        let mut reads = RangeSet::default();
        reads.add(b"r", b"s");
        assert_eq!(w.size(&reads), 15 + 2);
    }

    #[test]
    fn versionstamped_writes_are_unreadable() {
        let mut w = Writes::default();
        w.set_versionstamped_value(b"v", &param(b"")).expect("stamped value");
        assert_eq!(w.read(b"v", None), Err(accessed_unreadable()));
        w.set(b"v", b"plain").expect("set");
        assert_eq!(w.read(b"v", None), Err(accessed_unreadable()), "a later set leaves it unreadable (FDB 7.1)");
        w.clear(b"v");
        assert_eq!(w.read(b"v", None), Ok(None), "a clear makes it readable");
        w.set_versionstamped_key(&param(b"log/"), b"x", Some(0x0102)).expect("stamped key");
        let inside = [b"log/".as_slice(), &[0, 0, 0, 0, 0, 0, 1, 2, 0, 0]].concat();
        assert_eq!(w.read(&inside, None), Err(accessed_unreadable()));
        assert_eq!(w.read(b"log/", None), Ok(None), "below the lowest possible stamp");
        assert!(w.read_range(Vec::new(), b"log/", b"log0", 0, false).is_err());
        assert!(w.read_range(Vec::new(), b"a", b"b", 0, false).is_ok());
    }
}
