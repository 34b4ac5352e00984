#!/usr/bin/env bash
# The soak run: N jobs through three worker nodes (separate `erl' OS
# processes) sharing one embedded store, while one node is killed with
# kill -9 and restarted every 30 s, and every 60 s another OS process
# holds the store's write lock for 2x the workers' timeout (a store stall;
# python3's sqlite3 module). At the end it prints jobs added, finished,
# lost (must be 0), finished twice (must be 0), stuck (a job running under
# a live worker that is not running it, looked for during the run and
# after the drain; must be 0), live workers reaped (must be 0) and nodes
# that exited without being killed (must be 0), and exits 0 only when all
# five are 0 and every job was added.
#
#   scripts/soak.sh                          # 1,000,000 jobs, a kill every 30 s, a stall every 60 s
#   scripts/soak.sh --jobs 20000 --kill-every 10 --stall-every 20
#
# Options: --jobs N (1000000), --kill-every S (30), --nodes N (3),
# --workers N per node (8), --batch N jobs each worker holds at once (10),
# --timeout S worker health timeout (3), --dir D (/tmp/cw_soak: the
# store, the nodes' output nI.out and the workers' finish logs),
# --stall-every S (60; 0: no stalls), --stall-for S seconds the lock is
# held (2x --timeout), --stuck-after S (30: how long a job seen running
# unchanged under a live worker is a suspect), --inject-stuck (the stuck
# check's own test: the controller holds one job without running it; the
# run must then fail with stuck 1), --no-build (skip rebar3 compile).
# scripts/soak/cw_soak.erl says how "lost", "finished twice" and "stuck"
# are counted.
set -euo pipefail
cd "$(dirname "$0")/.."

JOBS=1000000
KILL_EVERY=30
NODES=3
WORKERS=8
BATCH=10
TIMEOUT=3
DIR=/tmp/cw_soak
BUILD=1
STALL_EVERY=60
STALL_FOR=undefined
STUCK_AFTER=30
INJECT_STUCK=false
while [ $# -gt 0 ]; do
    case "$1" in
        --jobs) JOBS=$2; shift 2 ;;
        --kill-every) KILL_EVERY=$2; shift 2 ;;
        --nodes) NODES=$2; shift 2 ;;
        --workers) WORKERS=$2; shift 2 ;;
        --batch) BATCH=$2; shift 2 ;;
        --timeout) TIMEOUT=$2; shift 2 ;;
        --dir) DIR=$2; shift 2 ;;
        --stall-every) STALL_EVERY=$2; shift 2 ;;
        --stall-for) STALL_FOR=$2; shift 2 ;;
        --stuck-after) STUCK_AFTER=$2; shift 2 ;;
        --inject-stuck) INJECT_STUCK=true; shift ;;
        --no-build) BUILD=0; shift ;;
        -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
        *) echo "soak: unknown argument $1" >&2; exit 2 ;;
    esac
done
for n in "$JOBS" "$KILL_EVERY" "$NODES" "$WORKERS" "$BATCH" "$TIMEOUT" "$STALL_EVERY" "$STUCK_AFTER"; do
    case "$n" in ''|*[!0-9]*) echo "soak: not a number: $n" >&2; exit 2 ;; esac
done
if [ "$STALL_FOR" != undefined ]; then
    case "$STALL_FOR" in ''|*[!0-9.]*|*.*.*|.*) echo "soak: --stall-for takes seconds (e.g. 6 or 6.5), not $STALL_FOR" >&2; exit 2 ;; esac
fi
if [ "$STALL_EVERY" != 0 ] && ! python3 -c 'import sqlite3' 2>/dev/null; then
    echo "soak: store stalls need python3 with its sqlite3 module (or pass --stall-every 0)" >&2
    exit 2
fi

if [ "$BUILD" = 1 ]; then
    rebar3 compile >&2
fi

EBIN=$(mktemp -d /tmp/cw_soak_ebin.XXXXXX)
trap 'rm -rf "$EBIN"' EXIT
erlc -o "$EBIN" scripts/soak/cw_soak.erl scripts/soak/cw_soak_node.erl

erl -noshell -noinput -pa "$(pwd)/_build/default/lib/couch_workers/ebin" -pa "$EBIN" -eval "
    cw_soak:main(#{jobs => $JOBS, kill_every => $KILL_EVERY, nodes => $NODES, workers => $WORKERS,
                   batch => $BATCH, timeout => $TIMEOUT, dir => \"$DIR\",
                   stall_every => $STALL_EVERY, stall_for => $STALL_FOR, stuck_after => $STUCK_AFTER,
                   inject_stuck => $INJECT_STUCK})."
