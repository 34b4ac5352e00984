//! The keys of the counts of job calls made inside callers' transactions
//! (`jobs/tx_counts.rs`; `docs/keyspace.md`).

use foundationdb_tuple::{unpack, Bytes};

use super::{b, tuple_range, Keyspace};

const TX_COUNTS: &[u8] = b"tx_counts";

impl Keyspace {
    /// `("couch_workers", "tx_counts", Node)`: little-endian i64, atomic
    /// adds: one per counted call that node relayed inside a caller's
    /// transaction. The node watches it.
    pub fn tx_counts_total(&self, node: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(TX_COUNTS), b(node)))
    }

    /// `("couch_workers", "tx_counts", Node, JobType, Event)`: little-endian
    /// i64, atomic adds: the node's counted calls of one type and event.
    pub fn tx_count(&self, node: &[u8], job_type: &[u8], event: &[u8]) -> Vec<u8> {
        self.root.pack(&(b(TX_COUNTS), b(node), b(job_type), b(event)))
    }

    /// Every `tx_count` key of `node` (not its total: the tuple range of
    /// the total's key holds only longer keys).
    pub fn tx_counts_range(&self, node: &[u8]) -> (Vec<u8>, Vec<u8>) {
        tuple_range(&self.tx_counts_total(node))
    }

    /// Decodes a `tx_count` key of `node`: `(job type, event)`.
    pub fn parse_tx_count(&self, node: &[u8], key: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
        let rest = key.strip_prefix(self.root.bytes())?;
        let (c, n, t, e) = unpack::<(Bytes, Bytes, Bytes, Bytes)>(rest).ok()?;
        (&*c == TX_COUNTS && &*n == node).then(|| (t.into_owned(), e.into_owned()))
    }
}
