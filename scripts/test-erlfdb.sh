#!/usr/bin/env bash
# couch_workers beside erlfdb in one VM, on a running FoundationDB cluster:
# builds erlfdb (scripts/build-erlfdb.sh), the NIF with the fdb feature
# (scripts/build-nif.sh), and runs the EUnit suite
# test/couch_workers_erlfdb_tests.erl.
#
#   FDB_CLUSTER_FILE=/path/fdb.cluster scripts/test-erlfdb.sh
#   scripts/fdb-cluster.sh run -- scripts/test-erlfdb.sh    # a throwaway cluster
#
# ERLFDB_SRC: erlfdb's source (default ../shared/erlfdb beside the
# repository). ERLFDB_EBIN: an erlfdb ebin/ to use instead of building one
# (its ../priv must hold erlfdb_nif.so).
set -eu

ROOT=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
cd "$ROOT"

if [ -z "${FDB_CLUSTER_FILE:-}" ]; then
    echo "test-erlfdb: FDB_CLUSTER_FILE is not set: give a running cluster's file, or run" >&2
    echo "test-erlfdb:   scripts/fdb-cluster.sh run -- scripts/test-erlfdb.sh" >&2
    exit 2
fi
if [ ! -r "$FDB_CLUSTER_FILE" ]; then
    echo "test-erlfdb: FDB_CLUSTER_FILE=$FDB_CLUSTER_FILE is not readable" >&2
    exit 2
fi

if [ -z "${ERLFDB_EBIN:-}" ]; then
    scripts/build-erlfdb.sh
    ERLFDB_EBIN=$ROOT/_build/erlfdb/ebin
fi
export ERLFDB_EBIN

COUCH_WORKERS_FEATURES=fdb scripts/build-nif.sh
export COUCH_WORKERS_FEATURES=fdb

echo "test-erlfdb: rebar3 eunit --module=couch_workers_erlfdb_tests (FDB_CLUSTER_FILE=$FDB_CLUSTER_FILE, ERLFDB_EBIN=$ERLFDB_EBIN)"
exec rebar3 eunit --module=couch_workers_erlfdb_tests
