//! The simulated cluster's data: every key's values by version (MVCC, as
//! FoundationDB's storage servers keep them), readable at any version of
//! the last [`MAX_READ_TRANSACTION_LIFE_VERSIONS`].

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::store::{KeyValue, MAX_READ_TRANSACTION_LIFE_VERSIONS};

/// `None` is a clear.
type History = Vec<(u64, Option<Vec<u8>>)>;

#[derive(Debug, Default)]
pub(super) struct VersionedData {
    keys: BTreeMap<Vec<u8>, History>,
}

/// The value a history holds at `version`.
fn at(history: &History, version: u64) -> Option<&Vec<u8>> {
    history.iter().rev().find(|(v, _)| *v <= version).and_then(|(_, value)| value.as_ref())
}

impl VersionedData {
    pub(super) fn get(&self, key: &[u8], version: u64) -> Option<Vec<u8>> {
        self.keys.get(key).and_then(|h| at(h, version)).cloned()
    }

    /// The newest value of `key`.
    pub(super) fn latest(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.get(key, u64::MAX)
    }

    /// Keys in `[begin, end)` at `version`, at most `limit` (0: all), from
    /// the end when `reverse`.
    pub(super) fn range(&self, begin: &[u8], end: &[u8], version: u64, limit: usize, reverse: bool) -> Vec<KeyValue> {
        if begin >= end {
            return Vec::new();
        }
        let bounds = (Bound::Included(begin.to_vec()), Bound::Excluded(end.to_vec()));
        let present = |(k, h): (&Vec<u8>, &History)| at(h, version).map(|v| (k.clone(), v.clone()));
        let limit = if limit == 0 { usize::MAX } else { limit };
        if reverse {
            self.keys.range(bounds).rev().filter_map(present).take(limit).collect()
        } else {
            self.keys.range(bounds).filter_map(present).take(limit).collect()
        }
    }

    /// Keys in `[begin, end)` that have a value now (for range clears).
    pub(super) fn live_keys(&self, begin: &[u8], end: &[u8]) -> Vec<Vec<u8>> {
        self.range(begin, end, u64::MAX, 0, false).into_iter().map(|(k, _)| k).collect()
    }

    /// Writes `value` (or a clear) at `version`, the newest version, and
    /// drops what no readable version can see any more.
    pub(super) fn write(&mut self, key: &[u8], value: Option<Vec<u8>>, version: u64) {
        let history = self.keys.entry(key.to_vec()).or_default();
        history.push((version, value));
        let horizon = version.saturating_sub(MAX_READ_TRANSACTION_LIFE_VERSIONS);
        // Keep the newest entry at or below the horizon: it is the value
        // of every readable version before the next entry.
        if let Some(keep_from) = history.iter().rposition(|(v, _)| *v <= horizon) {
            history.drain(..keep_from);
        }
        // Only clears left: every readable version sees no value, as it
        // would with no history at all.
        if history.iter().all(|(_, v)| v.is_none()) {
            self.keys.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_see_the_value_of_their_version() {
        let mut d = VersionedData::default();
        d.write(b"a", Some(b"1".to_vec()), 10);
        d.write(b"a", Some(b"2".to_vec()), 20);
        d.write(b"b", Some(b"x".to_vec()), 15);
        d.write(b"a", None, 30);
        assert_eq!(d.get(b"a", 9), None);
        assert_eq!(d.get(b"a", 19), Some(b"1".to_vec()));
        assert_eq!(d.get(b"a", 29), Some(b"2".to_vec()));
        assert_eq!(d.get(b"a", 30), None);
        assert_eq!(
            d.range(b"a", b"c", 25, 0, false),
            vec![(b"a".to_vec(), b"2".to_vec()), (b"b".to_vec(), b"x".to_vec())]
        );
        assert_eq!(d.range(b"a", b"c", 25, 1, true), vec![(b"b".to_vec(), b"x".to_vec())]);
        assert_eq!(d.range(b"a", b"c", 30, 0, false), vec![(b"b".to_vec(), b"x".to_vec())]);
    }

    #[test]
    fn old_versions_are_dropped_past_the_read_horizon() {
        let mut d = VersionedData::default();
        d.write(b"a", Some(b"1".to_vec()), 1);
        d.write(b"a", Some(b"2".to_vec()), 2);
        d.write(b"a", Some(b"3".to_vec()), 3 + MAX_READ_TRANSACTION_LIFE_VERSIONS);
        assert_eq!(d.keys[b"a".as_slice()].len(), 2, "the value at the horizon stays, the older one goes");
        assert_eq!(d.get(b"a", 3), Some(b"2".to_vec()));
        d.write(b"a", None, 10 + 3 * MAX_READ_TRANSACTION_LIFE_VERSIONS);
        d.write(b"a", None, 11 + 4 * MAX_READ_TRANSACTION_LIFE_VERSIONS);
        assert!(!d.keys.contains_key(b"a".as_slice()), "a long-cleared key is forgotten");
    }
}
