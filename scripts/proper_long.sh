#!/usr/bin/env bash
# The long run of the PropEr model test: random
# sequences of the whole public API, each call checked against the model
# (test/couch_workers_prop_tests.erl says what is checked).
#
#   scripts/proper_long.sh                      # 4,000 sequences of 0..50 calls: about 10^5 calls
#   scripts/proper_long.sh --sequences 400      # a shorter one
#   scripts/proper_long.sh --size 80            # longer sequences (0..80 calls each)
#
# PropEr draws each sequence's length uniformly from 0..size, so the calls
# are about sequences * size / 2; the run prints the exact count. Exit
# status 0 when every sequence passed. About 2 ms per call on a 2-core
# machine (the checks after each call dominate): some 4 minutes.
#
# Builds the app and the NIF first (rebar3 compile); --no-build skips it.
set -euo pipefail
cd "$(dirname "$0")/.."

SEQUENCES=4000
SIZE=50
BUILD=1
while [ $# -gt 0 ]; do
    case "$1" in
        --sequences) SEQUENCES=$2; shift 2 ;;
        --size) SIZE=$2; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "proper_long: unknown argument $1" >&2; exit 2 ;;
    esac
done

if [ "$BUILD" = 1 ]; then
    rebar3 compile >&2
fi

EBIN=$(mktemp -d /tmp/cw_proper_long.XXXXXX)
trap 'rm -rf "$EBIN"' EXIT
erlc -o "$EBIN" -I test test/couch_workers_test_util.erl test/couch_workers_prop_tests.erl test/couch_workers_prop_model.erl \
    test/couch_workers_prop_cmds.erl test/couch_workers_prop_world.erl

echo "proper_long: $SEQUENCES sequences of 0..$SIZE calls each (about $((SEQUENCES * SIZE / 2)) calls)"
erl -noshell -pa _build/default/lib/couch_workers/ebin -pa "$EBIN" -eval "
    Ctx = couch_workers_test_util:start_app(),
    {Passed, #{sequences := S, calls := C, per_command := Per, ms := Ms}} =
        couch_workers_prop_tests:run($SEQUENCES, $SIZE),
    io:format(\"~nproper_long: sequences ~b, calls ~b (~.1f per sequence), ~.1f s, result: ~s~n\",
              [S, C, C / max(1, S), Ms / 1000, case Passed of true -> \"passed\"; _ -> \"FAILED\" end]),
    io:format(\"proper_long: calls per command: ~p~n\", [Per]),
    couch_workers_test_util:stop_app(Ctx),
    halt(case Passed of true -> 0; _ -> 1 end)."
