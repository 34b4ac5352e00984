#!/usr/bin/env bash
# Runs the demo: two Erlang nodes share one embedded store; one is killed
# with kill -9 and its workers leave the other's membership.
# Installs what is missing (scripts/setup.sh) and builds first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
rebar3 compile
store_dir=$(mktemp -d /tmp/couch_workers_demo.XXXXXX)
trap 'rm -rf "$store_dir"' EXIT
escript scripts/demo.escript "$PWD/_build/default/lib/couch_workers/ebin" "$store_dir"
