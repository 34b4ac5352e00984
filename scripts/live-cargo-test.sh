#!/usr/bin/env bash
# Runs `cargo test ARGS -- --include-ignored [TEST_ARGS]` for suites that
# need a live FoundationDB (FDB_CLUSTER_FILE), and fails unless every test
# binary ran at least one test and none was ignored or failed: a live
# suite that runs nothing is a failure, never a pass.
#
#   scripts/live-cargo-test.sh CARGO_ARGS... [-- TEST_ARGS...]
set -euo pipefail
[ -n "${FDB_CLUSTER_FILE:-}" ] || { echo "live-cargo-test: FDB_CLUSTER_FILE is not set" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
cargo_args=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do cargo_args+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
rc=0
cargo test "${cargo_args[@]}" -- --include-ignored "$@" 2>&1 | tee "$out" || rc=$?
[ "$rc" = 0 ] || exit "$rc"
results=$(grep -E '^test result: ' "$out" || true)
[ -n "$results" ] || { echo "live-cargo-test: no test binary ran" >&2; exit 1; }
if echo "$results" | grep -Eqv ' ([1-9][0-9]*) passed; 0 failed; 0 ignored'; then
    echo "live-cargo-test: a live suite ran no test, or ignored some:" >&2
    echo "$results" >&2
    exit 1
fi
total=$(echo "$results" | awk '{ for (i = 1; i < NF; i++) if ($(i + 1) ~ /^passed/) n += $i } END { print n }')
echo "==> live on FoundationDB: $total tests passed, 0 ignored, in $(echo "$results" | wc -l) binaries"
