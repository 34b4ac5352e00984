//! What a transaction may not read back: the keys and ranges its own
//! versionstamped operations wrote, as FoundationDB refuses them
//! (`accessed_unreadable`, 1036; `ReadYourWrites.actor.cpp`).
//!
//! This store fills the versionstamp when the operation runs, so it could
//! answer; it refuses anyway, so that code which works here also works on
//! FoundationDB. As FDB does:
//!
//! * a versionstamped key makes unreadable every key it could become: the
//!   placeholder filled with the transaction's read version up to the
//!   placeholder filled with `0xff` (inclusive; FDB starts at 0 before the
//!   transaction's first read, this store always has its read version);
//! * a versionstamped value makes its key unreadable until the transaction
//!   clears it (setting it again does not: FoundationDB 7.1 still refuses);
//! * a refused read fails the transaction: its commit answers
//!   `accessed_unreadable` too ([`Unreadable::refused`]).

use crate::store::mutation::{fill_versionstamp, versionstamp};
use crate::store::{StoreError, VERSIONSTAMP_LEN};

fn accessed_unreadable() -> StoreError {
    StoreError::accessed_unreadable()
}

#[derive(Debug, Default)]
pub(super) struct Unreadable {
    /// `[begin, end)` ranges a versionstamped key may land in.
    ranges: Vec<(Vec<u8>, Vec<u8>)>,
    /// Keys holding a versionstamped value not cleared since.
    keys: Vec<Vec<u8>>,
    /// A read was refused: the commit must fail.
    refused: bool,
}

impl Unreadable {
    /// A versionstamped key: `bytes` with the placeholder at `offset`.
    pub(super) fn stamped_key(&mut self, bytes: &[u8], offset: usize, read_version: u64) {
        let begin = fill_versionstamp(bytes, offset, &versionstamp(read_version));
        let mut end = fill_versionstamp(bytes, offset, &[0xff; VERSIONSTAMP_LEN]);
        end.push(0);
        self.ranges.push((begin, end));
    }

    /// A versionstamped value of `key`.
    pub(super) fn stamped_value(&mut self, key: &[u8]) {
        self.keys.push(key.to_vec());
    }

    /// `key` was cleared: its value no longer depends on a stamp.
    pub(super) fn cleared_key(&mut self, key: &[u8]) {
        self.keys.retain(|k| k.as_slice() != key);
    }

    /// Whether a read was refused (the commit then fails with the same
    /// error, as FoundationDB's does).
    pub(super) fn refused(&self) -> bool {
        self.refused
    }

    /// `[begin, end)` was cleared.
    pub(super) fn cleared(&mut self, begin: &[u8], end: &[u8]) {
        self.keys.retain(|k| !(begin <= k.as_slice() && k.as_slice() < end));
    }

    pub(super) fn check_key(&mut self, key: &[u8]) -> Result<(), StoreError> {
        let in_range = self.ranges.iter().any(|(b, e)| b.as_slice() <= key && key < e.as_slice());
        if in_range || self.keys.iter().any(|k| k.as_slice() == key) {
            self.refused = true;
            return Err(accessed_unreadable());
        }
        Ok(())
    }

    pub(super) fn check_range(&mut self, begin: &[u8], end: &[u8]) -> Result<(), StoreError> {
        let overlaps = self.ranges.iter().any(|(b, e)| b.as_slice() < end && begin < e.as_slice());
        if overlaps || self.keys.iter().any(|k| begin <= k.as_slice() && k.as_slice() < end) {
            self.refused = true;
            return Err(accessed_unreadable());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamped(prefix: &[u8]) -> Vec<u8> {
        [prefix, &[0u8; VERSIONSTAMP_LEN][..]].concat()
    }

    #[test]
    fn a_stamped_key_hides_the_keys_it_could_become_not_older_ones() {
        let mut u = Unreadable::default();
        u.stamped_key(&stamped(b"log/"), 4, 100);
        let below = fill_versionstamp(&stamped(b"log/"), 4, &versionstamp(99));
        let above = fill_versionstamp(&stamped(b"log/"), 4, &versionstamp(5000));
        assert!(u.check_key(&below).is_ok(), "a key stamped before the read version stays readable");
        assert_eq!(u.check_key(&above), Err(accessed_unreadable()));
        assert!(u.check_range(b"log/", b"log0").is_err());
        assert!(u.check_range(b"a", b"log/").is_ok());
        assert!(u.check_key(b"other").is_ok());
    }

    #[test]
    fn a_stamped_value_hides_its_key_until_cleared() {
        let mut u = Unreadable::default();
        u.stamped_value(b"vs");
        assert!(!u.refused());
        assert!(u.check_key(b"vs").is_err());
        assert!(u.refused(), "a refused read fails the commit");
        assert!(u.check_range(b"v", b"w").is_err());
        u.cleared_key(b"vs");
        assert!(u.check_key(b"vs").is_ok());
        u.stamped_value(b"vs");
        u.cleared(b"v", b"w");
        assert!(u.check_key(b"vs").is_ok());
    }
}
