#!/usr/bin/env bash
# Runs every test: the Rust core (unit + conformance + key-space vectors +
# fault tests), the FoundationDB store's type-check, a benchmark smoke run,
# and the EUnit suites (including the multi-node tests with real `erl`
# nodes, the PropEr model and the reliability suites), and the integration
# builds of test/integration (CouchDB's rebar 2 tree, a rebar3 dependency,
# their releases). Installs what is missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

echo "==> cargo test (core crate: store conformance, key space, liveness, jobs)"
cargo test -p couch_workers_core

# The disk-fault tests (tests/faults_disk.rs) need root and are ignored
# here: disk_full failed once in a clean-clone run on 1 Dec 2026 (no
# heartbeat_recovered within 3 s after the space was freed) and is not yet
# understood. Run them by hand: cargo test -p couch_workers_core --test faults_disk -- --ignored
echo "==> NOT RUN: the root-only disk-fault tests (tests/faults_disk.rs, ignored; see README)"

echo "==> FoundationDB store: type-check (cargo check + clippy --features fdb)"
scripts/check-fdb.sh

echo "==> benchmark smoke run (proves bench/run works; no speed threshold)"
bench/run --smoke

echo "==> rebar3 eunit (builds the NIF through cargo first)"
rebar3 eunit

echo "==> integration: a CouchDB-shaped tree built with rebar 2 (compile, generate, boot, eunit)"
test/integration/couchdb_tree.sh

echo "==> integration: a rebar3 project depending on couch_workers by git (release, boot), rebar3 shell in place"
test/integration/rebar3_dep.sh
