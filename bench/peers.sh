#!/bin/sh
# bench/peers.sh: couch_workers beside its peers (BullMQ, graphile-worker,
# pg-boss, etcd from ../shared/peers) in one run, alternating rep by rep so
# that the machine's noise falls on both, then a table of medians and
# ratios. Prints the table on standard output (Markdown); every JSON line
# of the run is kept in bench/out/peers-RUNID/ (peers.jsonl, couch.jsonl).
#
# Usage: bench/peers.sh [--reps N] [--peers "bullmq graphile-worker etcd"]
#                       [--only J1,J1b,J2,J3,M2,M3] [--no-build]
#                       [--stores embedded,fdb]
#
# --stores: couch_workers' stores, each run in every rep after the peers
# (bench/run --store ...): embedded (the default), fdb (a local 1-process
# memory-engine FoundationDB cluster started with scripts/fdb-cluster.sh
# for the whole run and stopped after; the NIF is then built with
# COUCH_WORKERS_FEATURES=fdb, and the embedded rows use that build too),
# fdb:CLUSTER_FILE (that cluster). The table has a row per workload and
# store.
#
# Needs the team's peer harness: ../shared/peers beside the checkout, not
# part of a clone, or PEERS_DIR=DIR (its run.sh installs Redis,
# PostgreSQL, etcd and its npm packages on first use). It takes about
# 3 minutes per rep with the defaults (8 min for 3 reps, 1 Dec 2026); with
# --stores embedded,fdb and --only J1,J1b,J2,J2n,J3,M2,M3,J2x about 8
# minutes per rep (5 Dec 2026). Never fails on a ratio.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEERS_DIR=${PEERS_DIR:-$ROOT/../shared/peers}
REPS=3
PEERS="bullmq graphile-worker etcd"
ONLY="J1,J1b,J2,J3,M2,M3"
BUILD=1
STORES=embedded
while [ $# -gt 0 ]; do
    case "$1" in
        --reps) REPS=$2; shift 2 ;;
        --peers) PEERS=$2; shift 2 ;;
        --only) ONLY=$2; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        --stores) STORES=$2; shift 2 ;;
        *) echo "bench/peers.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ ! -x "$PEERS_DIR/run.sh" ]; then
    echo "bench/peers.sh: no peer harness at $PEERS_DIR (set PEERS_DIR)" >&2
    exit 2
fi

# The stores as bench/run's --store arguments; a bare fdb gets a cluster
# of this run's own.
STORE_ARGS=
FDB_DIR=
cleanup() {
    if [ -n "$FDB_DIR" ]; then "$ROOT/scripts/fdb-cluster.sh" stop "$FDB_DIR"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
for s in $(echo "$STORES" | tr ',' ' '); do
    case "$s" in
        embedded|fdb:*) ;;
        fdb)
            if [ -z "$FDB_DIR" ]; then
                eval "$("$ROOT/scripts/fdb-cluster.sh" start)"
                FDB_DIR=$FDB_CLUSTER_DIR
                echo "bench/peers.sh: FoundationDB cluster $FDB_CLUSTER_FILE" >&2
            fi
            s="fdb:$FDB_CLUSTER_FILE"
            ;;
        *) echo "bench/peers.sh: --stores takes embedded, fdb or fdb:CLUSTER_FILE, not $s" >&2; exit 2 ;;
    esac
    STORE_ARGS="$STORE_ARGS $s"
done
BUILD_STORE=embedded
for s in $STORE_ARGS; do
    case "$s" in fdb:*) BUILD_STORE=$s ;; esac
done

RUN_ID=$(date -u +%Y%m%dT%H%M%SZ)
OUT="$ROOT/bench/out/peers-$RUN_ID"
mkdir -p "$OUT"
if [ "$BUILD" = 1 ]; then
    # One build before the first rep, so no rep pays for it (with the
    # FoundationDB store in, when it is one of the stores).
    "$ROOT/bench/run" --smoke --only J1 --store "$BUILD_STORE" > /dev/null
fi

i=1
while [ "$i" -le "$REPS" ]; do
    echo "bench/peers.sh: rep $i of $REPS: peers ($PEERS)" >&2
    # shellcheck disable=SC2086 # PEERS is a word list on purpose
    RUN_ID="$RUN_ID" REPS=1 RESULTS="$OUT/peers.jsonl" "$PEERS_DIR/run.sh" $PEERS > /dev/null
    for s in $STORE_ARGS; do
        echo "bench/peers.sh: rep $i of $REPS: couch_workers on $s ($ONLY; load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
        # A workload that fails leaves an error line (and bench/run's
        # status 1); the other reps and stores still run.
        "$ROOT/bench/run" --no-build --only "$ONLY" --store "$s" | sed "s/^{/{\"rep\":$i,/" >> "$OUT/couch.jsonl" || true
    done
    i=$((i + 1))
done

python3 "$ROOT/bench/peers_table.py" "$OUT/peers.jsonl" "$OUT/couch.jsonl" "$RUN_ID"
