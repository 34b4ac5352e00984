#!/bin/sh
# bench/sqlite_replay.sh: SQLite's own time for J2's writes, with no store
# code around it: the ceiling that the engine, the key space and the
# durability put on J2, whatever the rest of the stack does.
#
# Usage: bench/sqlite_replay.sh [--jobs N]
#
# 1. builds cw_core_jobs and cw_sqlite_replay with the core's feature
#    sql-trace (into target/sql-trace, so that the normal build is left
#    alone; a second run only checks that they are up to date);
# 2. runs its J2 (N jobs, 8 tasks, on the core crate: the store's own job
#    path, no NIF) and its fill alone (J2fill), each tracing every statement
#    of the store's write connection, with its values, to a file;
# 3. replays both traces on a fresh bare-SQLite file with the store's
#    schema and settings (cw_sqlite_replay: 3 alternating reps, medians) as
#    recorded, then regrouped 8 store transactions to a commit (the largest
#    group commit that 8 workers with one call each in flight can form),
#    and prints one JSON line for each: SQLite's time per job of the drain
#    (J2 minus its fill), statements and commits per job, the time by
#    statement, and the rate that time allows (ceiling_jobs_per_s).
#
# SQLite lets one writer at a time into a database on the whole host, and
# every write of the store goes through its write connection, so no build
# of the store runs J2 faster than that ceiling on this engine, key space
# and durability. The traced run itself is slowed by the trace and is not
# a figure.
set -eu

ROOT=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
JOBS=20000
while [ $# -gt 0 ]; do
    case "$1" in
        --jobs) JOBS=$2; shift 2 ;;
        *) echo "bench/sqlite_replay.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

TARGET="$ROOT/target/sql-trace"
cd "$ROOT"
echo "bench/sqlite_replay.sh: cargo build (feature sql-trace) into $TARGET" >&2
cargo build --release --locked -p couch_workers_bench --features sql-trace \
    --example cw_core_jobs --example cw_sqlite_replay --target-dir "$TARGET" >&2

WORK=$(mktemp -d "${TMPDIR:-/tmp}/cw_sqlite_replay.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM
for part in J2 J2fill; do
    # Its own lines are not figures (the trace slows it): not printed.
    CW_SQL_TRACE="$WORK/$part.trace" "$TARGET/release/examples/cw_core_jobs" "$WORK/store-$part" "$JOBS" "$part" > /dev/null
    rm -rf "$WORK/store-$part"
done
for group in "" "--per-commit 8"; do
    # shellcheck disable=SC2086 # group is one optional flag and its value
    "$TARGET/release/examples/cw_sqlite_replay" $group "$WORK/replay" "$JOBS" "$WORK/J2.trace" "$WORK/J2fill.trace"
done
