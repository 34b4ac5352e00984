//! Counts of the calls a node relayed inside callers' transactions
//! (`jobs/tx_counts.rs`): the node's total key, its counters, and their
//! range, which holds every counter of the node and neither its total nor
//! another node's counters.

use super::*;

const TX_COUNTS: &str = "01 74785f636f756e7473 00";

#[test]
fn total_and_counter_keys() {
    for (ks, p) in both() {
        same(&ks.tx_counts_total(b"cw@host1"), &hs(&[p, ROOT, TX_COUNTS, "01 'cw@host1' 00"]));
        same(
            &ks.tx_count(b"cw@host1", b"repl", b"added"),
            &hs(&[p, ROOT, TX_COUNTS, "01 'cw@host1' 00", "01 'repl' 00", "01 6164646564 00"]),
        );
        // A NUL in a name is escaped as in every byte-string element.
        same(
            &ks.tx_count(b"n\x00", b"", b"removed"),
            &hs(&[p, ROOT, TX_COUNTS, "01 'n' 00ff 00", "01 00", "01 'removed' 00"]),
        );
    }
}

#[test]
fn range_holds_the_nodes_counters_only() {
    for (ks, p) in both() {
        let (begin, end) = ks.tx_counts_range(b"n");
        same(&begin, &hs(&[p, ROOT, TX_COUNTS, "01 'n' 00", "00"]));
        same(&end, &hs(&[p, ROOT, TX_COUNTS, "01 'n' 00", "ff"]));
        let inside = |k: &[u8]| begin.as_slice() <= k && k < end.as_slice();
        assert!(inside(&ks.tx_count(b"n", b"repl", b"added")));
        assert!(inside(&ks.tx_count(b"n", b"\xff", b"\xff")));
        assert!(!inside(&ks.tx_counts_total(b"n")), "the total is outside: a watch on it never reads itself");
        assert!(!inside(&ks.tx_count(b"n\x00", b"repl", b"added")));
        assert!(!inside(&ks.tx_count(b"n2", b"repl", b"added")));
        assert!(!inside(&ks.tx_count(b"m", b"repl", b"added")));
    }
}

#[test]
fn counter_keys_parse_back() {
    for (ks, _) in both() {
        let key = ks.tx_count(b"n", b"repl\x00x", b"canceled");
        assert_eq!(ks.parse_tx_count(b"n", &key), Some((b"repl\x00x".to_vec(), b"canceled".to_vec())));
        assert_eq!(ks.parse_tx_count(b"m", &key), None);
        assert_eq!(ks.parse_tx_count(b"n", &ks.tx_counts_total(b"n")), None);
        assert_eq!(ks.parse_tx_count(b"n", &ks.job(b"repl", b"j")), None);
    }
}
