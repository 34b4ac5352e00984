#!/usr/bin/env bash
# Checks that a built NIF holds none of the core crate's test kit (cargo
# feature `testkit`: the conformance suites, the fault-injecting store,
# the sim store):
# the test code lives behind that feature, which only the core crate's own
# tests enable (its dev-dependency on itself), so the NIF never compiles it.
#
# The release profile keeps debug info (`debug = 1`), so every module that
# was compiled into the library leaves its path in the file; before the
# feature existed, `couch_workers_core::conformance_keyspace` and
# `couch_workers_core::store::faulty` were found here.
#
# Usage: scripts/check-no-testkit.sh [path/to/libcouch_workers_nif.so]
# (default: priv/libcouch_workers_nif.so, as scripts/build-nif.sh installs it)
set -euo pipefail
cd "$(dirname "$0")/.."
lib=${1:-priv/libcouch_workers_nif.so}
if [ ! -f "$lib" ]; then
    echo "check-no-testkit.sh: $lib does not exist (build it with scripts/build-nif.sh)" >&2
    exit 1
fi
# Names of the test kit's modules as the debug info and symbols spell them
# (paths and mangled names).
found=$(strings "$lib" | grep -E 'couch_workers_core(::|\.\.)(conformance|store(::|\.\.)(faulty|hooked|sim))|18couch_workers_core(11conformance|20conformance_keyspace)|5store(6faulty|6hooked|3sim)' | head -n 5 || true)
if [ -n "$found" ]; then
    echo "check-no-testkit.sh: $lib contains test-kit code:" >&2
    echo "$found" >&2
    exit 1
fi
# A library without debug info would pass trivially: make sure the check
# can see the core crate at all.
if [ "$(strings "$lib" | grep -c couch_workers_core || true)" = 0 ]; then
    echo "check-no-testkit.sh: $lib has no couch_workers_core names (stripped?): cannot check" >&2
    exit 1
fi
echo "check-no-testkit.sh: $lib holds no test-kit code (conformance suites, store::faulty, store::hooked, store::sim)"
