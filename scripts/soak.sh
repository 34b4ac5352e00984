#!/usr/bin/env bash
# The soak run of issue 6 (part 7): N jobs through three worker nodes
# (separate `erl' OS processes) sharing one embedded store, while one node
# is killed with kill -9 and restarted every 30 s. At the end it prints
# jobs added, finished, lost (must be 0) and finished twice (must be 0),
# and exits 0 only when both are 0 and every job was added.
#
#   scripts/soak.sh                          # 1,000,000 jobs, a kill every 30 s
#   scripts/soak.sh --jobs 20000 --kill-every 10
#
# Options: --jobs N (1000000), --kill-every S (30), --nodes N (3),
# --workers N per node (8), --batch N jobs each worker holds at once (10),
# --timeout S worker health timeout (3), --dir D (/tmp/cw_soak: the
# store, the nodes' output nI.out and the workers' finish logs),
# --no-build (skip rebar3 compile). scripts/soak/cw_soak.erl says how
# "lost" and "finished twice" are counted.
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
while [ $# -gt 0 ]; do
    case "$1" in
        --jobs) JOBS=$2; shift 2 ;;
        --kill-every) KILL_EVERY=$2; shift 2 ;;
        --nodes) NODES=$2; shift 2 ;;
        --workers) WORKERS=$2; shift 2 ;;
        --batch) BATCH=$2; shift 2 ;;
        --timeout) TIMEOUT=$2; shift 2 ;;
        --dir) DIR=$2; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "soak: unknown argument $1" >&2; exit 2 ;;
    esac
done
for n in "$JOBS" "$KILL_EVERY" "$NODES" "$WORKERS" "$BATCH" "$TIMEOUT"; do
    case "$n" in ''|*[!0-9]*) echo "soak: not a number: $n" >&2; exit 2 ;; esac
done

if [ "$BUILD" = 1 ]; then
    rebar3 compile >&2
fi

EBIN=$(mktemp -d /tmp/cw_soak_ebin.XXXXXX)
trap 'rm -rf "$EBIN"' EXIT
erlc -o "$EBIN" scripts/soak/cw_soak.erl

erl -noshell -noinput -pa "$(pwd)/_build/default/lib/couch_workers/ebin" -pa "$EBIN" -eval "
    cw_soak:main(#{jobs => $JOBS, kill_every => $KILL_EVERY, nodes => $NODES, workers => $WORKERS,
                   batch => $BATCH, timeout => $TIMEOUT, dir => \"$DIR\"})."
