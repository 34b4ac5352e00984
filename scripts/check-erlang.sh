#!/usr/bin/env bash
# Dialyzer and xref, 0 warnings, on every Erlang module of the repository
# but the tests: the app (src/) through `rebar3 dialyzer` and
# `rebar3 xref` with rebar.config's settings, then the bench modules
# (bench/src) and the soak modules (scripts/soak), which are not part of
# the app, through scripts/check_erlang.escript: compiled with the app's
# erl_opts into a temp dir, dialyzer with the same warnings and the same
# PLT, xref with the same checks and ignores. Prints what it checked and
# the warnings found; exits nonzero on any warning.
#
# The PLT (erts, kernel, stdlib, inets) is _build/default/couch_workers_<OTP>_plt
# (and rebar3's base PLT beside it, rebar.config says why): built once by
# the first run (under 2 min on 2 cores), reused after (seconds).
# `rebar3 dialyzer` compiles the app first, so a tree without the NIF
# built runs the pre-compile hook (cargo) as `rebar3 compile` would.
set -euo pipefail
cd "$(dirname "$0")/.."

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "check-erlang: rebar3 dialyzer (the app, src/)"
rc=0; rebar3 dialyzer 2>&1 | tee "$out/dialyzer.log" || rc=$?
app_dialyzer=$(sed -n 's/.*Warnings occurred running dialyzer: \([0-9]*\).*/\1/p' "$out/dialyzer.log")
if [ "$rc" != 0 ]; then
    echo "check-erlang: rebar3 dialyzer failed (${app_dialyzer:-?} warnings)" >&2
    exit 1
fi
echo "check-erlang: rebar3 dialyzer: 0 warnings ($(sed -n 's/.*Analyzing \([0-9]*\) files.*/\1/p' "$out/dialyzer.log" | tail -n 1) modules of the app)"

echo "check-erlang: rebar3 xref (the app, src/)"
rc=0; rebar3 xref 2>&1 | tee "$out/xref.log" || rc=$?
if [ "$rc" != 0 ]; then
    echo "check-erlang: rebar3 xref failed ($(grep -c 'Warning: ' "$out/xref.log" || true) warnings)" >&2
    exit 1
fi
echo "check-erlang: rebar3 xref: 0 warnings"

# The PLT `rebar3 dialyzer` used: rebar.config's plt_prefix and this
# OTP's full version (rebar3's name for it).
otp=$(erl -noshell -eval 'io:put_chars(string:trim(element(2, file:read_file(filename:join([code:root_dir(), "releases", erlang:system_info(otp_release), "OTP_VERSION"]))))), halt().')
plt=_build/default/couch_workers_${otp}_plt
[ -f "$plt" ] || { echo "check-erlang: no PLT $plt (rebar3 dialyzer should have built it)" >&2; exit 1; }
echo "check-erlang: the bench and soak modules (PLT $plt)"
escript scripts/check_erlang.escript rebar.config "$plt" _build/default/lib/couch_workers/ebin \
    "$out/beams" bench/src scripts/soak

echo "check-erlang: 0 warnings (the app: rebar3 dialyzer, rebar3 xref; bench/src and scripts/soak: compile, dialyzer, xref)"
