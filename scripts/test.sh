#!/usr/bin/env bash
# Runs every test: the Rust core (unit + conformance + key-space vectors +
# fault tests), the FoundationDB store's type-check, a benchmark smoke run,
# and the EUnit suites (including the multi-node tests with real `erl`
# nodes, the PropEr model and the reliability suites), dialyzer and xref
# on every Erlang module but the tests (scripts/check-erlang.sh), the
# core's import rules (scripts/check-layers.py), and the
# integration builds of test/integration (CouchDB's rebar 2 tree, a rebar3 dependency,
# their releases). Installs what is missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The embedded stages run on the embedded store and the live ones on a
# cluster this script starts: a cluster file from the caller's
# environment would move the embedded stages onto it.
unset FDB_CLUSTER_FILE FDB_CLUSTER_DIR

# What the live stages need, looked for before any stage: a machine
# without it stops now with what to install, not 20 minutes in.
. scripts/fdb-env.sh
live_missing=""
if [ "$FDB_FOUND" != yes ]; then
    live_missing="No FoundationDB found. Install FoundationDB's official packages
(foundationdb-clients and foundationdb-server, 7.1 or newer:
https://github.com/apple/foundationdb/releases), or set
COUCH_WORKERS_FDB_DIR to a directory with bin/fdbserver, bin/fdbcli and
lib/libfdb_c.so."
elif ! scripts/build-erlfdb.sh --check; then
    live_missing="No erlfdb source (CouchDB's FoundationDB binding, built here with
erlc and cc): git clone https://github.com/apache/couchdb-erlfdb DIR,
then set ERLFDB_SRC=DIR."
fi
if [ -n "$live_missing" ]; then
    bar=$(printf '!%.0s' $(seq 1 78))
    printf '%s\n%s\nThe live suites cannot run. (COUCH_WORKERS_NO_FDB=1 runs the rest and says NOT RUN.)\n%s\n' \
        "$bar" "$live_missing" "$bar" >&2
    [ "${COUCH_WORKERS_NO_FDB:-}" = 1 ] || exit 1
    FDB_FOUND=no
fi

# A clean-clone run writes about 5.5 GB (cargo targets, _build, the
# integration trees); a full disk fails it halfway with a linker's bus
# error, so say it first.
free_kb=$(df -Pk . | awk 'NR == 2 { print $4 }')
echo "==> disk: $((free_kb / 1048576)) GB free here (a whole run writes about 5.5 GB)"
if [ "$free_kb" -lt $((6 * 1048576)) ]; then
  echo "==> WARNING: under 6 GB free: the run may fail with 'No space left on device'" >&2
fi

# Each stage's wall time, printed at the end (and at a failure), so that
# a CI run says where its minutes went.
stage_names=()
stage_secs=()
stage_start=$SECONDS
stage() {
    if [ "${#stage_names[@]}" -gt 0 ]; then
        stage_secs+=($((SECONDS - stage_start)))
    fi
    stage_names+=("$1")
    stage_start=$SECONDS
    echo "==> $1"
}
stage_report() {
    local n=${#stage_names[@]} i
    [ "$n" -gt "${#stage_secs[@]}" ] && stage_secs+=($((SECONDS - stage_start)))
    echo "==> time per stage (s):"
    for ((i = 0; i < n; i++)); do
        printf '%6d  %s\n' "${stage_secs[$i]}" "${stage_names[$i]}"
    done
    printf '%6d  total\n' "$SECONDS"
}
trap stage_report EXIT

stage "docs: every relative link of the README and docs/ resolves"
scripts/check-docs.sh
stage "cargo test (core crate: store conformance, key space, liveness, jobs), three test binaries at a time"
# Many of its binaries mostly wait (liveness timeouts, reapers, stalls):
# run one after another, as cargo does, they took 306 s; three at a time
# 113 s (2 cores, 5 Dec 2026).
scripts/parallel-cargo-test.py -p couch_workers_core
stage "cargo test (command line: argument parsing), and the release build of it (bin/couch-workers, used by its EUnit suite) and of the NIF"
cargo test -p couch_workers_cli
# The NIF in the same cargo run as the command line (one build of the
# core for both), and bin/couch-workers's stamp written: see the script.
scripts/build-release.sh
# bin/couch-workers rebuilds a binary this build rewrote when it is asked
# for other features (its stamp is then older than the binary):
scripts/test-bin-wrapper.sh

# The disk-fault tests (tests/faults_disk.rs: a full disk, store files
# that turn immutable, a lost mount) mount a tmpfs and use chattr, so they
# need root; they are #[ignore]d for plain `cargo test` and run here as root.
if [ "$(id -u)" = 0 ]; then
  stage "cargo test: the disk-fault tests (root: tmpfs, chattr)"
  cargo test -p couch_workers_core --test faults_disk -- --ignored
else
  echo "==> NOT RUN: the disk-fault tests (tests/faults_disk.rs) need root; run scripts/test.sh as root to include them"
fi

stage "FoundationDB store: type-check (clippy --features fdb, warnings are errors)"
scripts/check-fdb.sh

# A real FoundationDB for the live suites: a local cluster in a temp dir,
# stopped and removed when this script ends, however it ends.
stage "FoundationDB: a local cluster (scripts/fdb-cluster.sh)"
if [ "$FDB_FOUND" != yes ]; then
    echo "==> NOT RUN: every live FoundationDB suite (COUCH_WORKERS_NO_FDB=1)" >&2
else
    echo "==> FoundationDB: $FDB_WHERE"
    # A port taken between its choice and the server's bind: started again.
    scripts/fdb-cluster-retry-test.sh
    fdb_assignments=$(scripts/fdb-cluster.sh start)
    eval "$fdb_assignments"
    trap 'scripts/fdb-cluster.sh stop "$FDB_CLUSTER_DIR"; stage_report' EXIT
    echo "==> cluster file $FDB_CLUSTER_FILE"

    # Each binary's FoundationDB tests (the fdb:: module of store_tests!,
    # and its tests of FoundationDB alone); its embedded:: and sim:: ones
    # ran in the core crate's stage above.
    stage "FoundationDB live: the store and key-space conformance suites, a clean process exit, the job, worker and membership tests"
    FDB_CLUSTER_FILE=$FDB_CLUSTER_FILE scripts/live-cargo-test.sh \
        -p couch_workers_core --features fdb --test conformance_fdb --test fdb_exit --test fdb_commit_errors \
        --test jobs_queue --test jobs_accept --test jobs_subscribe --test jobs_lifecycle \
        --test jobs_failover --test jobs_finish_accept --test jobs_due --test jobs_wake \
        --test jobs_value_room --test jobs_departure_rules --test jobs_give_back \
        --test workers_heartbeat_service --test workers_owner_events --test workers_incarnation \
        --test sim_value_sizes --test sim_membership_log --test reaper_wake --test workers_unregister_race \
        --test jobs_take_contention --test jobs_subscribe_gap --test leadership --test schedules \
        --test jobs_type_settings --test jobs_unique --test jobs_history --test jobs_activity \
        --test jobs_limits --test jobs_group_counters \
        -- --skip embedded:: --skip sim::

    # One at a time, so that the cluster is quiet (nothing else commits):
    # the case in which versions move in lumps.
    stage "FoundationDB live: a killed node's workers leave a quiet cluster within timeout + 1 s (4 s and 15 s, 1 and 3 reapers)"
    FDB_CLUSTER_FILE=$FDB_CLUSTER_FILE scripts/live-cargo-test.sh \
        -p couch_workers_core --features fdb --test faults_liveness -- --test-threads 1 ::fdb
fi

stage "clippy on every crate (core, NIF, command line, the bench programs), warnings are errors; rustfmt --check (rustfmt.toml)"
cargo clippy --workspace --all-targets -- -D warnings
cargo fmt --all --check

stage "benchmark smoke run (proves bench/run works; no speed threshold)"
bench/run --smoke
# `bench/run --no-build` where no build ran stops at once with exit 2 and
# says what to run (it once failed every workload with a bare enoent):
# a copy of the script in an empty tree has no build.
nobuild=$(mktemp -d)
mkdir "$nobuild/bench" && cp bench/run "$nobuild/bench/run"
rc=0; "$nobuild/bench/run" --no-build --only handoff 2> "$nobuild/err" || rc=$?
if [ "$rc" != 2 ] || ! grep -q "no built app" "$nobuild/err"; then
    echo "bench/run --no-build without a build: exit $rc, expected 2 and 'no built app':" >&2
    cat "$nobuild/err" >&2
    exit 1
fi
rm -rf "$nobuild"

stage "rebar3 eunit (builds the NIF through cargo first)"
rebar3 eunit

# A short soak (the full one is `scripts/soak.sh`: 1,000,000 jobs):
# 100,000 jobs through three `erl` nodes with a kill -9 every 5 s and a
# 6 s store stall every 12 s, failing on any job lost, finished twice or
# stuck, or a live worker reaped; then the same with one job held
# without running it, which must be counted stuck (the check can fail).
stage "soak: 100,000 jobs, kill -9 every 5 s, a store stall every 12 s: lost 0, twice 0, stuck 0, live reaped 0; and a stuck job injected, found"
soak_dir=$(mktemp -d)
scripts/soak.sh --no-build --jobs 100000 --kill-every 5 --stall-every 12 --stuck-after 4 --dir "$soak_dir/run"
if scripts/soak.sh --no-build --jobs 60000 --kill-every 5 --stall-every 12 --stuck-after 4 --inject-stuck --dir "$soak_dir/inject" >"$soak_dir/inject.log" 2>&1; then
    cat "$soak_dir/inject.log"
    echo "==> the soak's stuck check missed an injected stuck job" >&2
    exit 1
fi
grep -q 'stuck: *1 ' "$soak_dir/inject.log" || { cat "$soak_dir/inject.log"; echo "==> the injected soak failed, but not for the stuck job" >&2; exit 1; }
echo "==> the injected stuck job was found (stuck 1, exit 1)"
rm -rf "$soak_dir"

stage "dialyzer and xref (the app, the bench and soak modules): 0 warnings"
scripts/check-erlang.sh

stage "the built NIF holds no test code (the core's testkit feature is off in it)"
scripts/check-no-testkit.sh
stage "the core's facade: at most 60 public items, and the NIF and the command line build on it alone"
scripts/check-facade.sh

stage "the core's import rules: layers point one way, no circle (scripts/check-layers.py)"
scripts/check-layers.py

stage "integration: a CouchDB-shaped tree built with rebar 2 (compile, generate, boot, eunit)"
test/integration/couchdb_tree.sh

stage "integration: a rebar3 project depending on couch_workers by git (release, boot), rebar3 shell in place"
test/integration/rebar3_dep.sh

# Last: these build the NIF with the fdb feature into priv/.
if [ "$FDB_FOUND" = yes ]; then
    stage "FoundationDB live: EUnit, every suite whose outcome depends on the store, with the app on the cluster, erlfdb beside it (the NIF and the command line built with the fdb feature)"
    scripts/build-erlfdb.sh
    # The command line and the NIF with fdb in one cargo run (the command
    # line's suite below runs bin/couch-workers on the cluster; the rebar
    # hook then finds the NIF built).
    scripts/build-release.sh fdb
    # The PropEr model runs 50 call sequences here (250 on the embedded
    # store above): on the cluster each takes about a second (250 took
    # 100-170 s of this stage, 100 took 98 s: 2-core machine, 5 Dec 2026),
    # and the whole run must stay under 30 minutes. The leak cycles: 300 of each kind (10,000 on the
    # embedded store), every path of a cycle at least 3 times (the rarest
    # is one cycle in 100); 1,000 took 64 s here. The suites that do not
    # depend on the store are left out (scripts/eunit-fdb-modules.sh).
    FDB_CLUSTER_FILE=$FDB_CLUSTER_FILE COUCH_WORKERS_FEATURES=fdb COUCH_WORKERS_LEAK_CYCLES=300 \
        COUCH_WORKERS_PROPER_NUMTESTS=50 rebar3 eunit --module="$(scripts/eunit-fdb-modules.sh)"

    # (Its EUnit suite ran it on the cluster above, on the suites' test
    # directory; this is the directory CouchDB's nodes use.)
    stage "FoundationDB live: the command line on fdb:CLUSTER_FILE (CouchDB's directory)"
    COUCH_WORKERS_FEATURES=fdb bin/couch-workers --store "fdb:$FDB_CLUSTER_FILE" status
    rc=0
    err=$(COUCH_WORKERS_FEATURES=fdb bin/couch-workers --store "fdb:$FDB_CLUSTER_FILE" pause "cw_no_such_type_$$" 2>&1) || rc=$?
    if [ "$rc" != 1 ] || ! echo "$err" | grep -q "no jobs or workers of type"; then
        echo "bin/couch-workers on FoundationDB: pause of an unknown type: exit $rc, expected 1 and a reason: $err" >&2
        exit 1
    fi

    stage "FoundationDB live: the demo (two nodes on the cluster, one killed with kill -9)"
    scripts/demo.sh --fdb "$FDB_CLUSTER_FILE"

    # Clusters of their own (one per fault: killed, stopped, recovered).
    stage "FoundationDB live: faults on real clusters (scripts/fdb-faults.sh: fdbserver killed and stopped, recoveries, exclude/include, a start while down, the watch limit, a killed node)"
    COUCH_WORKERS_FEATURES=fdb scripts/fdb-faults.sh --no-build
fi
