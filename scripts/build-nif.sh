#!/bin/sh
# Builds the couch_workers NIF and installs it as erlang/priv/libcouch_workers_nif.so.
#
# Run by `rebar3 compile` (pre_hooks in rebar.config); runnable by hand.
# COUCH_WORKERS_FEATURES: cargo features of the NIF crate, e.g. "fdb"
# (needs libfdb_c; see README).
#
# The old library is deleted before the new one is copied: overwriting a
# library that a running VM has loaded can crash that VM (rustler_mix
# compiler.ex does the same), while a deleted file stays mapped intact.
set -eu

ROOT=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
cd "$ROOT"

FEATURES=${COUCH_WORKERS_FEATURES:-}
if [ -n "$FEATURES" ]; then
    echo "build-nif: cargo build --release -p couch_workers_nif --features $FEATURES"
    cargo build --release -p couch_workers_nif --features "$FEATURES"
else
    echo "build-nif: cargo build --release -p couch_workers_nif"
    cargo build --release -p couch_workers_nif
fi

TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
case "$(uname -s)" in
    Darwin) LIB="$TARGET_DIR/release/libcouch_workers_nif.dylib" ;;
    *) LIB="$TARGET_DIR/release/libcouch_workers_nif.so" ;;
esac
if [ ! -f "$LIB" ]; then
    echo "build-nif: $LIB was not built" >&2
    exit 1
fi

DEST="$ROOT/erlang/priv/libcouch_workers_nif.so"
mkdir -p "$ROOT/erlang/priv"
if [ -f "$DEST" ] && cmp -s "$LIB" "$DEST"; then
    echo "build-nif: $DEST is up to date"
    exit 0
fi
rm -f "$DEST"
cp "$LIB" "$DEST.tmp.$$"
mv "$DEST.tmp.$$" "$DEST"
echo "build-nif: installed $DEST"
