#!/usr/bin/env bash
# Tests bin/couch-workers's decision to rebuild, with a stand-in `cargo`
# that records its calls and writes a stand-in binary (no real build).
# The wrapper must build when the binary is missing, when it was built
# with other features than asked for, and when cargo rewrote the binary
# after the wrapper's own build (its features are then unknown); and it
# must not build when nothing changed, nor after scripts/build-release.sh
# built the features asked for (it writes the wrapper's stamp).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/fakebin" "$T/target/release"
cat >"$T/fakebin/cargo" <<'FAKE'
#!/bin/sh
echo "cargo $*" >>"$CALLS"
# FRESH=1: cargo found the build fresh and leaves the binary as it is.
[ -n "${FRESH:-}" ] && exit 0
printf '#!/bin/sh\necho ran\n' >"$CARGO_TARGET_DIR/release/couch-workers"
chmod +x "$CARGO_TARGET_DIR/release/couch-workers"
FAKE
chmod +x "$T/fakebin/cargo"
export CALLS="$T/calls" CARGO_TARGET_DIR="$T/target" PATH="$T/fakebin:$PATH"
unset FDB_CLUSTER_FILE
fails=0
builds() { if [ -f "$CALLS" ]; then wc -l <"$CALLS"; else echo 0; fi; }
check() { # NAME EXPECTED_BUILDS FEATURES
    local before after
    before=$(builds)
    COUCH_WORKERS_FEATURES=$3 "$ROOT/bin/couch-workers" >/dev/null 2>&1
    after=$(builds)
    if [ $((after - before)) -eq "$2" ]; then
        echo "ok    $1"
    else
        echo "FAIL  $1: $((after - before)) builds, expected $2"
        fails=$((fails + 1))
    fi
}
check "missing binary: built" 1 ""
check "nothing changed: not built" 0 ""
check "other features asked: built" 1 fdb
check "same features again: not built" 0 fdb
# cargo (e.g. the test command's own build) rewrites the binary without
# features, after the wrapper's stamp said fdb.
sleep 1.1
printf '#!/bin/sh\necho ran\n' >"$T/target/release/couch-workers"
check "binary rewritten by cargo after the stamp: built" 1 fdb
check "and then nothing changed: not built" 0 fdb
# The test command's own build (scripts/build-release.sh) writes the
# stamp of what it built: the wrapper asked for those features does not
# build again, asked for others it does.
sleep 1.1
"$ROOT/scripts/build-release.sh" >/dev/null
check "after scripts/build-release.sh: not built" 0 ""
sleep 1.1
"$ROOT/scripts/build-release.sh" fdb >/dev/null
check "after scripts/build-release.sh fdb: not built" 0 fdb
check "after it, other features asked: built" 1 ""
# A source under native/ changed that is no source of the binary (a test):
# cargo finds the command line fresh and leaves the binary older than that
# file, which the wrapper would take for a stale binary. In a copy of the
# wrapper and the script, whose native/ can be touched.
mkdir -p "$T/root/bin" "$T/root/scripts" "$T/root/native"
cp "$ROOT/bin/couch-workers" "$T/root/bin/"
cp "$ROOT/scripts/build-release.sh" "$T/root/scripts/"
touch "$T/root/Cargo.toml" "$T/root/Cargo.lock"
"$T/root/scripts/build-release.sh" >/dev/null
sleep 1.1
touch "$T/root/native/a_test.rs"
FRESH=1 "$T/root/scripts/build-release.sh" >/dev/null
before=$(builds)
"$T/root/bin/couch-workers" >/dev/null 2>&1
if [ "$(builds)" -eq "$before" ]; then
    echo "ok    a test file changed, scripts/build-release.sh found it fresh: not built"
else
    echo "FAIL  a test file changed, scripts/build-release.sh found it fresh: built"
    fails=$((fails + 1))
fi
[ "$fails" -eq 0 ] || { echo "bin/couch-workers: $fails rebuild decisions wrong"; exit 1; }
echo "bin/couch-workers: rebuild decisions right"
