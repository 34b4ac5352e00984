#!/bin/sh
# Builds the couch_workers NIF and installs it as priv/libcouch_workers_nif.so.
#
# Run by the pre-compile hook of rebar.config (rebar3 and CouchDB's rebar 2,
# in place and as a dependency); runnable by hand.
#
# COUCH_WORKERS_FEATURES: cargo features of the NIF crate, e.g. "fdb"
#   (needs libfdb_c; see docs/fdb.md). Unset while FDB_CLUSTER_FILE is
#   set (the EUnit suites then run against FoundationDB): "fdb".
# CARGO_TARGET_DIR: where cargo builds; default target/ inside this
#   directory, so the build writes nothing outside it (but cargo's own
#   download cache, ~/.cargo).
#
# Nothing is run, and nothing written, when priv/ already holds a library
# built with the same features that is newer than every Rust source: a
# built checkout can be read-only, and a second compile costs no cargo run.
#
# The old library is deleted before the new one is copied: overwriting a
# library that a running VM has loaded can crash that VM (rustler_mix
# compiler.ex does the same), while a deleted file stays mapped intact.
set -eu

ROOT=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
cd "$ROOT"

if [ -z "${COUCH_WORKERS_FEATURES+set}" ] && [ -n "${FDB_CLUSTER_FILE:-}" ]; then
    FEATURES=fdb
    echo "build-nif: FDB_CLUSTER_FILE is set: building with the fdb feature (set COUCH_WORKERS_FEATURES to choose)"
else
    FEATURES=${COUCH_WORKERS_FEATURES:-}
fi
DEST="$ROOT/priv/libcouch_workers_nif.so"
STAMP="$ROOT/priv/libcouch_workers_nif.stamp"
WANT_STAMP="features=$FEATURES"

up_to_date() {
    [ -f "$DEST" ] && [ -f "$STAMP" ] || return 1
    [ "$(cat "$STAMP")" = "$WANT_STAMP" ] || return 1
    newer=$(find Cargo.toml Cargo.lock native -newer "$DEST" -print 2>/dev/null | head -n 1)
    [ -z "$newer" ]
}

if up_to_date; then
    echo "build-nif: $DEST is up to date (features: '${FEATURES}'); cargo not run"
    exit 0
fi

if ! command -v cargo >/dev/null 2>&1; then
    cat >&2 <<MSG
build-nif: cargo is not on the PATH, and $DEST is missing or older than
build-nif: the Rust sources in $ROOT/native.
build-nif: couch_workers is an Erlang application with a Rust NIF: install
build-nif: Rust (https://rustup.rs, then 'source ~/.cargo/env') and compile again.
MSG
    exit 1
fi

# rebar 2 exports its port compiler's defaults (CC=cc, AR=ar, ...) to
# hooks. They are the cc crate's defaults too, but cargo records them in
# the fingerprint of libsqlite3-sys's build script, so a build from rebar 2
# and one from rebar3 or a shell would rebuild each other's SQLite in a
# shared CARGO_TARGET_DIR. Drop those that hold just the default; a value
# the user set is kept.
if [ -n "${DRV_CC_TEMPLATE:-}" ]; then
    for pair in CC=cc CXX=c++ CPP=cpp AR=ar AS=as LD=ld NM=nm RANLIB=ranlib \
                STRIP=strip OBJCOPY=objcopy OBJDUMP=objdump; do
        name=${pair%%=*}
        eval "value=\${$name:-}"
        if [ "$value" = "${pair#*=}" ]; then
            unset "$name"
        fi
    done
fi

if [ -n "$FEATURES" ]; then
    echo "build-nif: cargo build --release --locked -p couch_workers_nif --features $FEATURES"
    cargo build --release --locked -p couch_workers_nif --features "$FEATURES"
else
    echo "build-nif: cargo build --release --locked -p couch_workers_nif"
    cargo build --release --locked -p couch_workers_nif
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

mkdir -p "$ROOT/priv"
if [ -f "$DEST" ] && cmp -s "$LIB" "$DEST"; then
    # Same bytes: refresh the time so the check above skips cargo next time.
    touch "$DEST"
    echo "build-nif: $DEST is up to date"
else
    rm -f "$DEST"
    cp "$LIB" "$DEST.tmp.$$"
    mv "$DEST.tmp.$$" "$DEST"
    echo "build-nif: installed $DEST"
fi
echo "$WANT_STAMP" > "$STAMP.tmp.$$"
mv "$STAMP.tmp.$$" "$STAMP"
