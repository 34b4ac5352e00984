//! Conflict ranges and the resolver's check, as FoundationDB's resolvers
//! make it: a transaction conflicts when a range it read (without
//! `snapshot`) intersects a range that a transaction committed after its
//! read version wrote.

use std::collections::VecDeque;

/// `key ++ \x00`: the first key after `key` (FDB's `keyAfter`).
pub(super) fn key_after(key: &[u8]) -> Vec<u8> {
    let mut k = key.to_vec();
    k.push(0);
    k
}

/// A set of half-open key ranges, kept sorted and coalesced (as the
/// client coalesces a transaction's conflict ranges before it commits).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct RangeSet {
    ranges: Vec<(Vec<u8>, Vec<u8>)>,
}

impl RangeSet {
    pub(super) fn add(&mut self, begin: &[u8], end: &[u8]) {
        if begin >= end {
            return;
        }
        let (mut begin, mut end) = (begin.to_vec(), end.to_vec());
        // Every range that touches [begin, end) merges into it.
        let first = self.ranges.partition_point(|(_, e)| e.as_slice() < begin.as_slice());
        let mut last = first;
        while last < self.ranges.len() && self.ranges[last].0 <= end {
            last += 1;
        }
        if first < last {
            begin = begin.min(self.ranges[first].0.clone());
            end = end.max(self.ranges[last - 1].1.clone());
        }
        self.ranges.splice(first..last, [(begin, end)]);
    }

    pub(super) fn add_key(&mut self, key: &[u8]) {
        self.add(key, &key_after(key));
    }

    pub(super) fn intersects(&self, begin: &[u8], end: &[u8]) -> bool {
        if begin >= end {
            return false;
        }
        let i = self.ranges.partition_point(|(_, e)| e.as_slice() <= begin);
        i < self.ranges.len() && self.ranges[i].0.as_slice() < end
    }

    pub(super) fn intersects_any(&self, other: &RangeSet) -> bool {
        other.ranges.iter().any(|(b, e)| self.intersects(b, e))
    }

    pub(super) fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Bytes as FDB counts a conflict range towards the transaction size:
    /// begin and end keys.
    pub(super) fn byte_size(&self) -> usize {
        self.ranges.iter().map(|(b, e)| b.len() + e.len()).sum()
    }
}

/// The write ranges of recent commits, by version.
#[derive(Debug, Default)]
pub(super) struct ConflictHistory {
    commits: VecDeque<(u64, RangeSet)>,
}

impl ConflictHistory {
    /// Whether a transaction that read `reads` at `read_version` conflicts
    /// with a commit after that version.
    pub(super) fn conflicts(&self, read_version: u64, reads: &RangeSet) -> bool {
        if reads.is_empty() {
            return false;
        }
        self.commits.iter().rev().take_while(|(v, _)| *v > read_version).any(|(_, writes)| writes.intersects_any(reads))
    }

    /// Records a commit's writes; forgets commits at or below `horizon`
    /// (no transaction that old may commit).
    pub(super) fn record(&mut self, version: u64, writes: RangeSet, horizon: u64) {
        if !writes.is_empty() {
            self.commits.push_back((version, writes));
        }
        while self.commits.front().is_some_and(|(v, _)| *v <= horizon) {
            self.commits.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ranges: &[(&[u8], &[u8])]) -> RangeSet {
        let mut s = RangeSet::default();
        for (b, e) in ranges {
            s.add(b, e);
        }
        s
    }

    #[test]
    fn ranges_coalesce_and_intersect_half_open() {
        let s = set(&[(b"c", b"e"), (b"a", b"b"), (b"d", b"g"), (b"b", b"c")]);
        assert_eq!(s.ranges, vec![(b"a".to_vec(), b"g".to_vec())]);
        let s = set(&[(b"a", b"b"), (b"x", b"y")]);
        assert!(s.intersects(b"a\x00", b"a\x01"));
        assert!(!s.intersects(b"b", b"c"), "end is exclusive");
        assert!(!s.intersects(b"0", b"a"), "a range ending at begin does not touch it");
        assert!(s.intersects(b"c", b"z"));
        assert!(!s.intersects(b"c", b"c"), "an empty range touches nothing");
    }

    #[test]
    fn only_commits_after_the_read_version_conflict() {
        let mut h = ConflictHistory::default();
        h.record(10, set(&[(b"k", b"k\x00")]), 0);
        h.record(20, set(&[(b"m", b"n")]), 0);
        let reads = set(&[(b"k", b"k\x00")]);
        assert!(h.conflicts(9, &reads));
        assert!(!h.conflicts(10, &reads), "a commit at the read version is seen, not a conflict");
        assert!(h.conflicts(15, &set(&[(b"m\x05", b"m\x06")])));
        assert!(!h.conflicts(0, &RangeSet::default()), "no reads, no conflict");
        h.record(30, RangeSet::default(), 10);
        assert!(!h.conflicts(9, &reads), "forgotten below the horizon");
    }
}
