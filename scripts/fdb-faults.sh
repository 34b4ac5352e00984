#!/usr/bin/env bash
# Fault tests of couch_workers on a real local FoundationDB cluster (real
# fdbserver processes from scripts/fdb-cluster.sh; nothing simulated).
# For each fault: a fresh cluster, two couch_workers nodes (separate `erl'
# OS processes, 3 workers each with a 4 s health timeout, a job added
# every 50 ms by each), the fault, then a settle, a drain and the count.
# One summary line per fault:
#
#   fault N NAME: lost=L twice=T live_reaped=R wrong_answers=W dead_node_left_ms=X (...)
#
# and the exit status is nonzero when any of lost, twice, live_reaped,
# wrong_answers (or, for fault 6, sub_missed) is nonzero, or a node or
# the harness failed. docs/fdb-faults.md says what each fault does
# and what the counts mean; scripts/fdb_faults/cw_faults.erl how they are
# counted.
#
#   scripts/fdb-faults.sh                 # every fault (1-7)
#   scripts/fdb-faults.sh --fault 3       # one fault (by number or name)
#   scripts/fdb-faults.sh --fault 1,sigstop --no-build
#
# Faults: 1 kill9 (kill -9 of the only fdbserver, restart after 5 s),
# 2 sigstop (SIGSTOP of it for 2x, then 3x the timeout), 3 recovery (3
# processes: kill -9 of the one holding the cluster controller and
# master), 4 exclude (3 processes: exclude one, then include it),
# 5 start_down (the nodes start while the cluster is down; it starts 5 s
# later), 6 watch_limit (client knob default_max_outstanding_watches=5
# through FDB_NETWORK_OPTION_KNOB; every added job subscribed to),
# 7 node_kill (kill -9 of a couch_workers node). Not in `all': 8
# node_stop_control, a check of the checker: a couch_workers node frozen
# with SIGSTOP for 3x the timeout, whose live workers are reaped; it
# must report live_reaped > 0 and exit 1.
#
# Options: --fault LIST (all), --dir D (default a new
# /tmp/cw_fdb_faults.XXXXXX per run, so that two runs at once never share
# a fault's cluster, pids or logs: one directory per fault with the
# nodes' logs), --timeout S (4),
# --no-build (skip the fdb NIF build and rebar3 compile).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

FAULTS=all
DIR=
TIMEOUT=4
BUILD=1
while [ $# -gt 0 ]; do
    case "$1" in
        --fault|--faults) FAULTS=$2; shift 2 ;;
        --dir) DIR=$2; shift 2 ;;
        --timeout) TIMEOUT=$2; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
        *) echo "fdb-faults: unknown argument $1" >&2; exit 2 ;;
    esac
done
case "$TIMEOUT" in ''|*[!0-9]*) echo "fdb-faults: --timeout takes whole seconds" >&2; exit 2 ;; esac

names=(x kill9 sigstop recovery exclude start_down watch_limit node_kill node_stop_control)
list=()
if [ "$FAULTS" = all ]; then
    list=(1 2 3 4 5 6 7)
else
    IFS=, read -r -a wanted <<<"$FAULTS"
    for f in "${wanted[@]}"; do
        n=""
        for i in 1 2 3 4 5 6 7 8; do
            if [ "$f" = "$i" ] || [ "$f" = "${names[$i]}" ]; then n=$i; fi
        done
        [ -n "$n" ] || { echo "fdb-faults: no fault $f (1-8 or ${names[*]:1})" >&2; exit 2; }
        list+=("$n")
    done
fi

# shellcheck source=fdb-env.sh
. scripts/fdb-env.sh
[ "$FDB_FOUND" = yes ] || { echo "fdb-faults: no FoundationDB found (see scripts/fdb-env.sh)" >&2; exit 2; }
export FDB_CLI
command -v python3 >/dev/null || { echo "fdb-faults: needs python3 (reads fdbcli's status json)" >&2; exit 2; }

if [ "$BUILD" = 1 ]; then
    export COUCH_WORKERS_FEATURES=fdb
    scripts/build-nif.sh >&2
    rebar3 compile >&2
fi
if ! grep -qx 'features=fdb' priv/libcouch_workers_nif.stamp 2>/dev/null; then
    echo "fdb-faults: priv/ holds no NIF built with the fdb feature (run without --no-build)" >&2
    exit 2
fi

EBIN=$(mktemp -d /tmp/cw_fdb_faults_ebin.XXXXXX)
trap 'rm -rf "$EBIN"' EXIT
erlc -o "$EBIN" scripts/fdb_faults/cw_faults.erl scripts/fdb_faults/cw_faults_node.erl

# A directory of this run's own: two runs at once (two clean-clone test
# runs) in one directory stopped and read each other's clusters (lost,
# twice and wrong answers counted in both, 5 Dec 2026).
[ -n "$DIR" ] || DIR=$(mktemp -d /tmp/cw_fdb_faults.XXXXXX)
mkdir -p "$DIR"
summary=()
rc=0
start=$SECONDS
for n in "${list[@]}"; do
    fdir="$DIR/fault$n"
    frc=0
    erl -noshell -noinput -pa "$ROOT/_build/default/lib/couch_workers/ebin" -pa "$EBIN" -eval "
        cw_faults:main(#{fault => $n, dir => \"$fdir\", root => \"$ROOT\", timeout => $TIMEOUT})." || frc=$?
    if [ -f "$fdir/summary" ]; then
        summary+=("$(cat "$fdir/summary")")
    else
        summary+=("fault $n ${names[$n]}: NO SUMMARY (controller exit $frc; see $fdir)")
    fi
    [ "$frc" = 0 ] || rc=1
done

echo
echo "fdb-faults: $((SECONDS - start)) s; logs under $DIR"
for s in "${summary[@]}"; do echo "$s"; done
exit "$rc"
