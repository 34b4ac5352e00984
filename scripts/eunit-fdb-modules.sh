#!/bin/sh
# Prints the EUnit modules of the FoundationDB run (comma-separated, for
# `rebar3 eunit --module=...`): every test/*_tests.erl but the suites
# whose outcome does not depend on the store, which the embedded run of
# the same test command already ran. A new suite runs on FoundationDB
# unless it is named here.
#
# Left out, and why (each runs on the embedded store, rebar3 eunit):
#
# * couch_workers_sched_tests: a NIF's time on its scheduler, which by
#   construction holds no store work (the store's work and the reply run
#   on the Rust runtime and are waited for untimed); on the cluster it
#   took 25 s (12 s embedded) for the same measurement;
# * couch_workers_nif_wait_tests: the Erlang side's wait for an answer
#   across a stop of the VM (a peer with no app and no store);
# * couch_workers_config_tests: settings (the app env, the ini section,
#   the examples in erlang/); its one start names an embedded store.
set -eu
ROOT=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)

SKIP="couch_workers_sched_tests couch_workers_nif_wait_tests couch_workers_config_tests"

mods=""
for f in "$ROOT"/test/*_tests.erl; do
    m=$(basename "$f" .erl)
    case " $SKIP " in
        *" $m "*) continue ;;
    esac
    mods="${mods:+$mods,}$m"
done
echo "$mods"
