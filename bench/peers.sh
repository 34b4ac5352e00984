#!/bin/sh
# bench/peers.sh: couch_workers beside its peers (BullMQ, graphile-worker,
# pg-boss, etcd from ../shared/peers) in one run, alternating rep by rep so
# that the machine's noise falls on both, then a table of medians and
# ratios. Prints the table on standard output (Markdown); every JSON line
# of the run is kept in bench/out/peers-RUNID/ (peers.jsonl, couch.jsonl).
#
# Usage: bench/peers.sh [--reps N] [--peers "bullmq graphile-worker etcd"]
#                       [--only J1,J1b,J2,J3,M2,M3] [--no-build]
#
# Needs the team's peer harness: ../shared/peers beside the checkout, not
# part of a clone, or PEERS_DIR=DIR (its run.sh installs Redis,
# PostgreSQL, etcd and its npm packages on first use). It takes about
# 3 minutes per rep with the defaults (8 min for 3 reps, 1 Dec 2026). Never fails on a ratio.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEERS_DIR=${PEERS_DIR:-$ROOT/../shared/peers}
REPS=3
PEERS="bullmq graphile-worker etcd"
ONLY="J1,J1b,J2,J3,M2,M3"
BUILD=1
while [ $# -gt 0 ]; do
    case "$1" in
        --reps) REPS=$2; shift 2 ;;
        --peers) PEERS=$2; shift 2 ;;
        --only) ONLY=$2; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        *) echo "bench/peers.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ ! -x "$PEERS_DIR/run.sh" ]; then
    echo "bench/peers.sh: no peer harness at $PEERS_DIR (set PEERS_DIR)" >&2
    exit 2
fi

RUN_ID=$(date -u +%Y%m%dT%H%M%SZ)
OUT="$ROOT/bench/out/peers-$RUN_ID"
mkdir -p "$OUT"
if [ "$BUILD" = 1 ]; then
    # One build before the first rep, so no rep pays for it.
    "$ROOT/bench/run" --smoke --only J1 > /dev/null
fi

i=1
while [ "$i" -le "$REPS" ]; do
    echo "bench/peers.sh: rep $i of $REPS: peers ($PEERS)" >&2
    # shellcheck disable=SC2086 # PEERS is a word list on purpose
    RUN_ID="$RUN_ID" REPS=1 RESULTS="$OUT/peers.jsonl" "$PEERS_DIR/run.sh" $PEERS > /dev/null
    echo "bench/peers.sh: rep $i of $REPS: couch_workers ($ONLY)" >&2
    "$ROOT/bench/run" --no-build --only "$ONLY" | sed "s/^{/{\"rep\":$i,/" >> "$OUT/couch.jsonl"
    i=$((i + 1))
done

python3 "$ROOT/bench/peers_table.py" "$OUT/peers.jsonl" "$OUT/couch.jsonl" "$RUN_ID"
