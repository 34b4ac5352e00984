#!/usr/bin/env bash
# Counts the public items of the core crate's facade, as a build without
# the `internals` feature (which `testkit` turns on; the NIF and the
# command line enable neither) sees them, and fails above the limit.
#
# Exact for how lib.rs is built: without `internals` every module is
# `pub(crate)` (`internal_modules!`, and `log` by hand), so what another
# crate can name is (1) each name of lib.rs's `pub use` lines outside a
# `#[cfg(feature = "testkit")]` item, (2) each `pub mod` not behind that
# feature (none now), and (3) each `#[macro_export]` macro, which lands at
# the crate's root. The names are taken from the source; then
# `cargo check` of the NIF and the command line (both without `testkit`)
# shows that they build on the facade alone.
#
# Usage: scripts/check-facade.sh [LIMIT]   (default 60)
set -euo pipefail
cd "$(dirname "$0")/.."
limit=${1:-60}
lib=native/couch_workers_core/src/lib.rs
src=native/couch_workers_core/src

# The items of lib.rs, one per line, with the gated ones dropped: an item
# after `#[cfg(feature = "testkit")]` or `"internals"` is skipped up to its `;`.
items=$(awk '
    /^#\[cfg\(feature = "(testkit|internals)"\)\]/ { skip = 1; next }
    skip && /;/ { skip = 0; next }
    skip { next }
    /^pub use / || /^pub mod / || inuse {
        line = $0
        if (line ~ /^pub mod /) { sub(/^pub mod /, "", line); sub(/;.*/, "", line); print "mod " line; next }
        sub(/^pub use /, "", line)
        buf = buf " " line
        inuse = (line !~ /;/)
        if (!inuse) {
            # a::b::{C, D} or a::b as c or a::b
            gsub(/[{}; ]+/, " ", buf)
            n = split(buf, parts, " ")
            for (i = 1; i <= n; i++) {
                p = parts[i]; gsub(/,/, "", p)
                if (p == "") continue
                if (p == "as") { renamed = 1; continue }
                if (renamed) { last = p; renamed = 0; continue }
                if (last != "") print last
                k = split(p, segs, "::"); last = segs[k]
            }
            if (last != "") print last
            buf = ""; last = ""
        }
    }
' "$lib" | sort -u)
macros=$(grep -rh -A1 '^#\[macro_export\]' "$src" --include=*.rs | grep -o 'macro_rules! [a-z_]*' | awk '{print $2 "!"}' | sort -u)
# Macros of the testkit modules (test_store, conformance, conformance_keyspace).
testkit_macros=$(grep -h -A1 '^#\[macro_export\]' "$src/test_store.rs" "$src"/conformance/*.rs "$src"/conformance_keyspace/*.rs 2>/dev/null | grep -o 'macro_rules! [a-z_]*' | awk '{print $2 "!"}' | sort -u || true)
macros=$(comm -23 <(echo "$macros") <(echo "$testkit_macros"))
all=$(printf '%s\n%s\n' "$items" "$macros" | sed '/^$/d' | sort -u)
count=$(echo "$all" | wc -l)
echo "$all" | tr '\n' ' '
echo
echo "check-facade.sh: $count public items without internals/testkit (limit $limit)"
if [ "$count" -gt "$limit" ]; then
    echo "check-facade.sh: over the limit" >&2
    exit 1
fi
# The NIF and the command line build on the facade alone (no testkit).
# Without warnings: an item only tests use is gated behind `internals`,
# not left dead in the build users make (cargo replays cached warnings).
out=$(cargo check -q -p couch_workers_nif -p couch_workers_cli 2>&1) || { echo "$out" >&2; exit 1; }
if echo "$out" | grep -q '^warning'; then
    echo "$out" >&2
    echo "check-facade.sh: the NIF's and the command line's build of the core has warnings" >&2
    exit 1
fi
echo "check-facade.sh: the NIF and the command line build without the core's testkit, with no warning"
