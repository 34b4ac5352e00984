#!/bin/sh
# The release builds of the command line and the NIF in one cargo run,
# with the given features (none, or e.g. "fdb"), for the test command:
#
#   scripts/build-release.sh [FEATURES]
#
# One run, because the NIF's rustler turns on a feature of syn
# (extra-traits) that changes the build of every crate above syn (the
# proc macros, tokio, the core): a build of the command line alone
# compiles the core and most of its dependencies a second time (68 s of
# a 2-core machine, 5 Dec 2026). scripts/build-nif.sh's own build of the
# NIF alone (the rebar hook) resolves the same features and finds it
# built.
#
# Then it writes the stamp of bin/couch-workers (the features its binary
# was built with): without it the wrapper takes the binary for one built
# with unknown features and builds the command line alone, which is that
# second compile (the first EUnit run of the command line's suite did).
set -eu

ROOT=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
cd "$ROOT"
FEATURES=${1:-}

if [ -n "$FEATURES" ]; then
    set -- --features "couch_workers_cli/$FEATURES,couch_workers_nif/$FEATURES"
else
    set --
fi
echo "build-release: cargo build --release --locked -p couch_workers_cli -p couch_workers_nif $*"
cargo build --release --locked -p couch_workers_cli -p couch_workers_nif "$@"

# The binary marked checked, as the wrapper does after its own build:
# cargo leaves it as it is when no source of it changed (a test or a doc
# under native/ did), and the wrapper builds a binary older than a
# source. Then the stamp bin/couch-workers reads and writes (its STAMP),
# newer than the binary.
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
touch "$TARGET/release/couch-workers"
echo "features=$FEATURES" >"$TARGET/release/couch-workers.features"
