#!/bin/sh
# bench/ab.sh: one change's cost, measured as its before and after in one
# run. Two built checkouts (say, a worktree at the old commit and this
# one) run the same workloads rep by rep, alternating which goes first,
# so that the machine's noise falls on both; then a table of medians and
# after/before ratios (bench/ab_table.py). Never fails on a ratio.
#
# Usage: bench/ab.sh BEFORE_DIR AFTER_DIR [--reps N] [--only J1,J2,J3,M2]
#                                          [--out DIR]
#
# Each directory must have been built (`bench/run --only J1` there once
# builds it); the reps run `bench/run --no-build --runs 1`. Every JSON
# line is kept in DIR/ab.jsonl (default bench/out/ab-RUNID/), tagged with
# its side ("before" or "after") and its rep.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 2 ] || { echo "usage: bench/ab.sh BEFORE_DIR AFTER_DIR [--reps N] [--only LIST] [--out DIR]" >&2; exit 2; }
BEFORE=$(cd "$1" && pwd)
AFTER=$(cd "$2" && pwd)
shift 2
REPS=10
ONLY=J1,J2,J3,M2
OUT=$ROOT/bench/out/ab-$(date -u +%Y%m%dT%H%M%SZ)
while [ $# -gt 0 ]; do
    case "$1" in
        --reps) REPS=$2; shift 2 ;;
        --only) ONLY=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        *) echo "bench/ab.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
for d in "$BEFORE" "$AFTER"; do
    [ -x "$d/bench/run" ] || { echo "bench/ab.sh: no bench/run in $d" >&2; exit 2; }
done
mkdir -p "$OUT"
echo "bench/ab.sh: before $BEFORE ($(git -C "$BEFORE" rev-parse --short HEAD)), after $AFTER ($(git -C "$AFTER" rev-parse --short HEAD)), $REPS reps of $ONLY; lines in $OUT/ab.jsonl" >&2

one() { # side dir rep
    (cd "$2" && bench/run --no-build --only "$ONLY" --runs 1 2>>"$OUT/$1.stderr") | grep '^{' |
        sed "s/^{/{\"side\":\"$1\",\"rep\":$3,/" >>"$OUT/ab.jsonl" ||
        echo "bench/ab.sh: rep $3 of $1 failed (see $OUT/$1.stderr)" >&2
}
rep=1
while [ "$rep" -le "$REPS" ]; do
    if [ $((rep % 2)) = 1 ]; then
        one before "$BEFORE" "$rep"; one after "$AFTER" "$rep"
    else
        one after "$AFTER" "$rep"; one before "$BEFORE" "$rep"
    fi
    echo "bench/ab.sh: rep $rep of $REPS done" >&2
    rep=$((rep + 1))
done
python3 "$ROOT/bench/ab_table.py" "$OUT/ab.jsonl"
