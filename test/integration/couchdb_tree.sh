#!/usr/bin/env bash
# CouchDB's build, reproduced: the checkout at src/couch_workers of a tree
# shaped like CouchDB's (a top rebar.config with sub_dirs, rel/reltool.config
# as CouchDB's: lib_dirs ../src, profile embedded, an app entry with
# incl_cond include), built with rebar 2 (Debian's 2.6.4 stands in for
# CouchDB's). Checks, in order:
#   1. `rebar compile` builds the NIF (cargo, from the app's hook) and the app;
#   2. a second `rebar compile` does not run cargo, and works without cargo
#      on the PATH from a read-only copy of the built app (bind mount; root);
#   3. `rebar generate` makes a release whose lib/couch_workers-VSN has
#      ebin/ and priv/ with the NIF and no Rust;
#   4. a node booted from the release, with the source tree moved away,
#      starts couch_workers from the release's lib/ and answers
#      worker_register/4;
#   5. `rebar -r eunit apps=couch_workers` (CouchDB's `make eunit
#      apps=couch_workers`) runs EUnit suites of the app: by default the
#      app and multi-node ones (CW_IT_SUITES=all for every suite).
IT_NAME=couchdb
source "$(dirname "$0")/lib.sh"

command -v rebar >/dev/null 2>&1 || fail "rebar (Debian's rebar 2) is not installed: run scripts/setup.sh"
VSN=$(app_vsn)
TREE="$SCRATCH/couchdb"
APP="$TREE/src/couch_workers"
copy_checkout "$APP"
mkdir -p "$TREE/rel"
cat > "$TREE/rebar.config" <<'CONF'
%% The top of a CouchDB source tree, reduced to couch_workers.
{sub_dirs, ["src/couch_workers", "rel"]}.
CONF
cat > "$TREE/rel/reltool.config" <<'CONF'
%% A release made as CouchDB makes its own (rel/reltool.config there).
{sys, [
    {lib_dirs, ["../src"]},
    {rel, "couchdb", "1.0.0", [kernel, stdlib, sasl, crypto, couch_workers]},
    {rel, "start_clean", "", [kernel, stdlib]},
    {boot_rel, "couchdb"},
    {profile, embedded},
    {excl_sys_filters, ["^bin/.*", "^erts.*/bin/(dialyzer|typer)"]},
    {excl_archive_filters, [".*"]},
    {incl_cond, exclude},
    {app, kernel, [{incl_cond, include}]},
    {app, stdlib, [{incl_cond, include}]},
    {app, sasl, [{incl_cond, include}]},
    {app, crypto, [{incl_cond, include}]},
    {app, couch_workers, [{incl_cond, include}]}
]}.
{target_dir, "couchdb"}.
CONF

say "1. rebar compile (in $TREE)"
(cd "$TREE" && rebar compile) > "$SCRATCH/compile1.log" 2>&1 || { cat "$SCRATCH/compile1.log" >&2; fail "rebar compile"; }
grep -E '^build-nif:|Finished|Compiling couch_workers' "$SCRATCH/compile1.log" | sed "s/^/it[$IT_NAME]:   /" || true
[ -f "$APP/ebin/couch_workers.app" ] || fail "no $APP/ebin/couch_workers.app"
[ -f "$APP/ebin/couch_workers.beam" ] || fail "no $APP/ebin/couch_workers.beam"
[ -f "$APP/priv/libcouch_workers_nif.so" ] || fail "no $APP/priv/libcouch_workers_nif.so"
say "   built ebin/couch_workers.app and priv/libcouch_workers_nif.so"

say "2. rebar compile again: cargo must not run"
(cd "$TREE" && rebar compile) > "$SCRATCH/compile2.log" 2>&1 || { cat "$SCRATCH/compile2.log" >&2; fail "second rebar compile"; }
grep -q 'cargo not run' "$SCRATCH/compile2.log" || { cat "$SCRATCH/compile2.log" >&2; fail "the second compile ran cargo"; }
say "   cargo not run"
# A process that just left the mount can keep it busy for a moment.
release_mount() {
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        umount "$1" 2>/dev/null && return 0
        sleep 0.5
    done
    umount -l "$1"
}
RO="$SCRATCH/readonly"
mkdir -p "$RO"
if mount --bind "$APP" "$RO" 2>/dev/null; then
    if mount -o remount,ro,bind "$RO" 2>/dev/null; then
        set +e
        (cd "$RO" && env PATH=/usr/bin:/bin rebar compile) > "$SCRATCH/compile_ro.log" 2>&1
        rc=$?
        set -e
        release_mount "$RO"
        [ $rc -eq 0 ] || { cat "$SCRATCH/compile_ro.log" >&2; fail "rebar compile of the read-only built app, without cargo"; }
        say "   read-only copy of the built app, no cargo on the PATH: rebar compile passes"
    else
        release_mount "$RO"
        say "   SKIPPED the read-only check: cannot remount read-only here"
    fi
else
    say "   SKIPPED the read-only check: bind mounts need root"
fi

say "3. rebar generate"
(cd "$TREE" && rebar generate) > "$SCRATCH/generate.log" 2>&1 || { cat "$SCRATCH/generate.log" >&2; fail "rebar generate"; }
REL="$TREE/rel/couchdb"
check_release_app_dir "$REL/lib/couch_workers-$VSN"

say "4. boot the release"
boot_release "$REL" "$REL/releases/1.0.0/couchdb" "" "$APP"

say "5. rebar -r eunit apps=couch_workers"
SUITES=${CW_IT_SUITES:-couch_workers_app_tests,couch_workers_config_tests,couch_workers_multinode_tests}
if [ "$SUITES" = all ]; then suites_arg=(); else suites_arg=("suites=$SUITES"); fi
# On a failure: each failed test with what EUnit said of it, then the tail.
eunit_failed() {
    grep -n -B3 -A40 -E '\*failed\*|\*timed out\*|::error:|::exit:' "$SCRATCH/eunit.log" | head -200 >&2 || true
    tail -40 "$SCRATCH/eunit.log" >&2
    fail "$1"
}
(cd "$TREE" && rebar -r eunit apps=couch_workers "${suites_arg[@]}") > "$SCRATCH/eunit.log" 2>&1 || eunit_failed "rebar eunit"
grep -E 'tests? passed|Failed:' "$SCRATCH/eunit.log" | sed "s/^/it[$IT_NAME]:   /"
grep -qE 'All [0-9]+ tests passed' "$SCRATCH/eunit.log" || eunit_failed "rebar eunit did not pass every test"
say "PASSED"
