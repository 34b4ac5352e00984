//! Atomic adds of a write transaction, held until something needs them.
//!
//! Every job transaction moves counters (`place.rs`: −1 on the old
//! state's count, +1 on the new one's), and on SQLite an add is a read and
//! a write of the row. An accept round that takes k jobs adds to the same
//! two counters k times each. Adds to one key commute, so a writer keeps
//! their sum per key here and writes each key once: when the transaction
//! commits, or earlier when one of its own operations touches that key
//! (a read, a write, a clear), so that it still reads its own writes.

use crate::store::VERSIONSTAMP_LEN;

#[derive(Default)]
pub(crate) struct PendingAdds {
    /// Key and the sum of its deltas; few keys per transaction, so a
    /// vector searched linearly.
    sums: Vec<(Vec<u8>, i64)>,
}

impl PendingAdds {
    /// Adds `delta` to `key`'s sum. Returns whether the key is new here.
    pub(crate) fn add(&mut self, key: &[u8], delta: i64) -> bool {
        match self.sums.iter_mut().find(|(k, _)| k.as_slice() == key) {
            Some((_, sum)) => {
                *sum = sum.wrapping_add(delta);
                false
            }
            None => {
                self.sums.push((key.to_vec(), delta));
                true
            }
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.sums.is_empty()
    }

    /// Removes and returns the sums whose keys `touched` says the next
    /// operation touches.
    pub(crate) fn take(&mut self, touched: impl Fn(&[u8]) -> bool) -> Vec<(Vec<u8>, i64)> {
        // Most operations touch none of them: nothing to move then.
        if !self.sums.iter().any(|(k, _)| touched(k)) {
            return Vec::new();
        }
        let (taken, kept) = std::mem::take(&mut self.sums).into_iter().partition(|(k, _)| touched(k));
        self.sums = kept;
        taken
    }
}

/// Whether `key` could be the key a versionstamped-key write of `bytes`
/// (stamp at `offset`) becomes, whatever the stamp.
pub(crate) fn may_be_stamped(key: &[u8], bytes: &[u8], offset: usize) -> bool {
    let end = offset + VERSIONSTAMP_LEN;
    key.len() == bytes.len() && key.get(..offset) == bytes.get(..offset) && key.get(end..) == bytes.get(end..)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_per_key_and_takes_only_what_is_touched() {
        let mut adds = PendingAdds::default();
        assert!(adds.add(b"a", 1));
        assert!(adds.add(b"b", -1));
        assert!(!adds.add(b"a", 2));
        assert!(!adds.add(b"b", -4));
        assert_eq!(adds.take(|k| k == b"b"), vec![(b"b".to_vec(), -5)]);
        assert!(!adds.is_empty());
        assert_eq!(adds.take(|_| true), vec![(b"a".to_vec(), 3)]);
        assert!(adds.is_empty());
    }

    #[test]
    fn a_stamped_key_matches_only_outside_its_stamp() {
        let mut bytes = b"p/".to_vec();
        bytes.extend_from_slice(&[0u8; VERSIONSTAMP_LEN]);
        bytes.extend_from_slice(b"/id");
        let mut key = bytes.clone();
        key[2..2 + VERSIONSTAMP_LEN].copy_from_slice(&[7u8; VERSIONSTAMP_LEN]);
        assert!(may_be_stamped(&key, &bytes, 2));
        key[1] = b'x';
        assert!(!may_be_stamped(&key, &bytes, 2));
        assert!(!may_be_stamped(b"p/", &bytes, 2));
    }
}
