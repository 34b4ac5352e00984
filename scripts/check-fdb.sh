#!/usr/bin/env bash
# Type-checks the FoundationDB store (cargo feature `fdb` of
# couch_workers_core): cargo clippy -D warnings of every target of the
# core crate (library, unit tests, integration tests with
# tests/conformance_fdb.rs), then runs the key-space test vectors.
#
# Clippy is the type-check: clippy-driver is rustc's whole front end
# (parsing, name resolution, type and borrow checking, every rustc lint)
# with clippy's lints added, so whatever `cargo check` rejects, clippy
# rejects too, and -D warnings also fails on rustc's warnings. A `cargo
# check` before it checked the same targets twice (docs/testing.md,
# "What the build time was cut by").
#
# FoundationDB's client library (libfdb_c) is not needed: the
# `foundationdb` crate generates its bindings with bindgen from headers it
# embeds (feature `embedded-fdb-include`), which needs libclang only, and
# clippy never links.
set -euo pipefail
cd "$(dirname "$0")/.."

have_libclang() {
    dpkg-query -W -f='${Status}' libclang-dev 2>/dev/null | grep -q 'install ok installed'
}

if ! have_libclang; then
    echo "==> installing libclang-dev (bindgen needs it to generate the FDB bindings)"
    sudo=""
    if [ "$(id -u)" != 0 ]; then
        if command -v sudo >/dev/null 2>&1; then
            sudo="sudo"
        else
            echo "check-fdb.sh: libclang-dev is missing and this is not root (no sudo): apt-get install -y libclang-dev" >&2
            exit 1
        fi
    fi
    # Wait for another apt/dpkg run instead of failing on its lock.
    apt_opts=(-y -o DPkg::Lock::Timeout=600)
    $sudo apt-get install "${apt_opts[@]}" libclang-dev || {
        $sudo apt-get update -o DPkg::Lock::Timeout=600
        $sudo apt-get install "${apt_opts[@]}" libclang-dev
    }
fi

echo "==> cargo clippy -p couch_workers_core --features fdb --all-targets -- -D warnings"
cargo clippy -p couch_workers_core --features fdb --all-targets -- -D warnings

echo "==> cargo test -p couch_workers_core --test keyspace_vectors"
cargo test -p couch_workers_core --test keyspace_vectors

# The live suites run in scripts/test.sh, on a local cluster it starts
# (scripts/fdb-cluster.sh): this script needs no cluster.
