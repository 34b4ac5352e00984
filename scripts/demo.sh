#!/usr/bin/env bash
# Runs the demo: two Erlang nodes share one store; one is killed with
# kill -9 and its workers leave the other's membership.
#
#   scripts/demo.sh                      the embedded store (a temp dir)
#   scripts/demo.sh --fdb                FoundationDB: a local cluster started
#                                        for the demo (scripts/fdb-cluster.sh)
#   scripts/demo.sh --fdb CLUSTER_FILE   FoundationDB: that cluster, under a
#                                        directory of the demo's own, removed after
#
# Installs what is missing (scripts/setup.sh) and builds first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [ "${1:-}" = --fdb ]; then
    if [ -z "${2:-}" ]; then
        exec scripts/fdb-cluster.sh run -- "$0" --fdb-cluster-file-from-env
    fi
    cluster_file=$2
elif [ "${1:-}" = --fdb-cluster-file-from-env ]; then
    cluster_file=$FDB_CLUSTER_FILE
else
    cluster_file=""
fi
if [ -n "$cluster_file" ]; then
    export COUCH_WORKERS_FEATURES=fdb
    rebar3 compile
    escript scripts/demo.escript "$PWD/_build/default/lib/couch_workers/ebin" "fdb:$(realpath "$cluster_file")"
else
    rebar3 compile
    store_dir=$(mktemp -d /tmp/couch_workers_demo.XXXXXX)
    trap 'rm -rf "$store_dir"' EXIT
    escript scripts/demo.escript "$PWD/_build/default/lib/couch_workers/ebin" "embedded:$store_dir"
fi
