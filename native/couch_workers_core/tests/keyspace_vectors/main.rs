//! Test vectors that pin the bytes of every key and value of the key space
//! (`couch_workers_core::keyspace`), under the empty prefix (the embedded
//! store) and under a directory prefix (FoundationDB's `couchdb`
//! directory; `15 0c` is the shape of a prefix the directory layer's
//! allocator hands out).
//!
//! Every expected value is written by hand from the FoundationDB tuple
//! layer spec (apple/foundationdb `design/tuple.md`), never by calling the
//! packer under test:
//!
//! * byte string: `01`, the bytes with each `00` written `00 ff`, then `00`;
//! * integer: `14` for zero; `15`..`1c` then the big-endian magnitude in
//!   1..8 bytes for a positive one; `13`..`0c` then the one's complement of
//!   the magnitude's big-endian bytes for a negative one;
//! * versionstamp (96-bit): `33`, the 10-byte transaction versionstamp,
//!   the 2-byte big-endian user version; an incomplete one has `ff` x 10,
//!   and the packed key or value ends with the placeholder's position as a
//!   4-byte little-endian offset (API version 520 and later), counted from
//!   the start of the whole key, prefix included.
//!
//! These are the bytes erlfdb writes too (apache/couchdb-erlfdb
//! `src/erlfdb_tuple.erl`): `encode(Bin, _) when is_binary(Bin) ->
//! [<<?BYTES>>, enc_null_terminated(Bin)]` with `-define(BYTES, 16#01)` and
//! `<<?NULL, ?ESCAPE>>` (`00 ff`) for an embedded NUL; integers use the
//! same codes (`?ZERO` 16#14, `?POS_INT_1..8` 16#15..16#1C, `?NEG_INT_1..8`
//! 16#13..16#0C, with the `bxor 16#FF` one's complement); `pack_vs/2`
//! writes `?VS96` (16#33) and appends `<<VsnPos:32/unsigned-little>>` with
//! `VsnPos = Pos + size(Prefix)`. So an Erlang node using erlfdb and the
//! prototype's binaries (`<<"couch_workers">>`) reads and writes the same
//! keys as this crate.

use couch_workers_core::keyspace::{version_of, Keyspace, WorkerKey};

/// Hand-written bytes. Tokens are separated by spaces: a token in single
/// quotes is ASCII text (no spaces), anything else is hex digits.
fn h(spec: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for token in spec.split_whitespace() {
        if let Some(text) = token.strip_prefix('\'') {
            let text = text.strip_suffix('\'').expect("closing quote");
            out.extend_from_slice(text.as_bytes());
        } else {
            assert!(token.len() % 2 == 0, "odd hex token {token:?}");
            for i in (0..token.len()).step_by(2) {
                out.push(u8::from_str_radix(&token[i..i + 2], 16).expect("hex"));
            }
        }
    }
    out
}

/// `h` of several parts, concatenated.
fn hs(parts: &[&str]) -> Vec<u8> {
    h(&parts.join(" "))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
}

#[track_caller]
fn same(actual: &[u8], expected: &[u8]) {
    assert_eq!(hex(actual), hex(expected));
}

// The schema's names, as tuple-layer byte strings, in plain hex.
/// ("couch_workers",)
const ROOT: &str = "01 636f7563685f776f726b657273 00";
/// strinc of ROOT: its last byte 00 -> 01.
const WORKERS: &str = "01 776f726b657273 00";
const VS: &str = "01 7673 00";
const MEMBER: &str = "01 6d656d626572 00";
const HEALTH: &str = "01 6865616c7468 00";
const JOBS: &str = "01 6a6f6273 00";
const PENDING: &str = "01 70656e64696e67 00";
const ACTIVE: &str = "01 616374697665 00";
const COUNTS: &str = "01 636f756e7473 00";
const JOBS_VS: &str = "01 6a6f62735f7673 00";
const ORPHANS: &str = "01 6f727068616e73 00";
const ORPHANS_VS: &str = "01 6f727068616e735f7673 00";
const REAPER_PULSE: &str = "01 'reaper_pulse' 00";
const HEALTH_VS: &str = "01 'health_vs' 00";
const RECEIPTS: &str = "01 7265636569707473 00";

/// A sample directory prefix (what the directory layer could allocate).
const DIR: &str = "15 0c";

fn both() -> [(Keyspace, &'static str); 2] {
    [(Keyspace::new(b""), ""), (Keyspace::new(&h(DIR)), DIR)]
}

/// A complete 12-byte tuple versionstamp: commit version 0x0102030405060708,
/// batch order 0x090a, user version 0x000b.
const VS12: [u8; 12] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 11];
const VS12_HEX: &str = "0102030405060708 090a 000b";

/// The tuple-layer integers, by hand (see the module doc).
const INTS: &[(i64, &str)] = &[
    (i64::MIN, "0c 7fffffffffffffff"),
    (i64::MIN + 1, "0c 8000000000000000"),
    (-1_000_000, "11 f0bdbf"),
    (-256, "12 feff"),
    (-255, "13 00"),
    (-1, "13 fe"),
    (0, "14"),
    (1, "15 01"),
    (255, "15 ff"),
    (256, "16 0100"),
    (1_000_000, "17 0f4240"),
    (1_700_000_000, "18 6553f100"),
    (i64::MAX, "1c 7fffffffffffffff"),
];

mod jobs;
mod ordering;
mod parsing;
mod tx_counts;
mod workers;
