#!/usr/bin/env bash
# Runs every test: the Rust core (unit + conformance + key-space vectors +
# fault tests), the FoundationDB store's type-check, a benchmark smoke run,
# and the EUnit suites (including the multi-node tests with real `erl`
# nodes, the PropEr model and the reliability suites). Installs what is
# missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

echo "==> cargo test (core crate: store conformance, key space, liveness, jobs)"
cargo test -p couch_workers_core

echo "==> FoundationDB store: type-check (cargo check + clippy --features fdb)"
scripts/check-fdb.sh

echo "==> benchmark smoke run (proves bench/run works; no speed threshold)"
bench/run --smoke

echo "==> rebar3 eunit (builds the NIF through cargo first)"
rebar3 eunit
