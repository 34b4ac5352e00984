#!/usr/bin/env bash
# A local FoundationDB cluster on demand, in a temp directory, on free
# loopback ports. Nothing outside that directory is touched, and two runs
# at once do not collide (each has its own directory and ports).
#
#   scripts/fdb-cluster.sh start [--procs N]
#       Starts N fdbserver processes (default 1: the memory engine,
#       `single` redundancy; 3: `double` redundancy, every process a
#       coordinator, for fault tests), waits until fdbcli reports the
#       database available, and prints shell assignments for eval:
#         FDB_CLUSTER_FILE=...  the cluster file
#         FDB_CLUSTER_DIR=...   the directory (data, logs, pids)
#   scripts/fdb-cluster.sh stop DIR
#       Kills the cluster's processes and removes DIR.
#   scripts/fdb-cluster.sh run [--procs N] -- CMD [ARGS...]
#       Starts a cluster, runs CMD with FDB_CLUSTER_FILE and
#       FDB_CLUSTER_DIR set, stops it and removes everything whatever CMD
#       did (also on INT/TERM); exits with CMD's status.
#   scripts/fdb-cluster.sh kill DIR I [SIGNAL]
#   scripts/fdb-cluster.sh restart DIR I
#       Sends SIGNAL (default KILL) to process I (0-based), or starts it
#       again with the same port, data and logs: for fault tests.
#
# FoundationDB is found as scripts/fdb-env.sh says (COUCH_WORKERS_FDB_DIR,
# an installed FoundationDB, or ../shared/fdb).
set -euo pipefail
here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
# shellcheck source=fdb-env.sh
. "$here/fdb-env.sh"

die() { echo "fdb-cluster: $*" >&2; exit 1; }

need_fdb() {
    [ "$FDB_FOUND" = yes ] || die "no FoundationDB found: install the official packages \
(foundationdb-clients and foundationdb-server, https://github.com/apple/foundationdb/releases), \
or set COUCH_WORKERS_FDB_DIR to a directory with bin/fdbserver, bin/fdbcli and lib/libfdb_c.so"
}

# Attempts of start_cluster so far (a port taken between free_port and
# the server's bind starts the cluster again on other ports).
start_attempt=1

# A loopback port nobody listens on now (the server's bind is the real
# test: start_proc fails if it was taken meanwhile, and start retries).
# COUCH_WORKERS_FDB_TAKEN_PORT, for the test of that retry: the port the
# first attempt's first process is given, whether free or not.
free_port() {
    local p
    if [ "$start_attempt" = 1 ] && [ -n "${COUCH_WORKERS_FDB_TAKEN_PORT:-}" ] && [ "${1:-}" = 0 ]; then
        echo "$COUCH_WORKERS_FDB_TAKEN_PORT"
        return 0
    fi
    for _ in $(seq 1 200); do
        p=$((20000 + RANDOM % 40000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return 0
        fi
    done
    die "no free loopback port found"
}

start_proc() {
    local dir=$1 i=$2 port
    port=$(cat "$dir/port.$i")
    mkdir -p "$dir/data.$i" "$dir/logs.$i"
    # A zone and machine of its own: `double` redundancy places the
    # replicas of tlogs and storage in distinct zones, and processes of
    # one host would otherwise share one.
    # setsid: the server is not in the caller's process group, so a ^C
    # of a test run reaches it only through this script's stop.
    setsid "$FDB_SERVER" -p "127.0.0.1:$port" -C "$dir/fdb.cluster" \
        -d "$dir/data.$i" -L "$dir/logs.$i" --listen-address "127.0.0.1:$port" \
        --locality-zoneid "z$i" --locality-machineid "m$i" \
        </dev/null >"$dir/server.$i.out" 2>&1 &
    echo $! >"$dir/pid.$i"
}

stop_cluster() {
    local dir=$1 f
    [ -d "$dir" ] || return 0
    for f in "$dir"/pid.*; do
        [ -f "$f" ] || continue
        kill -KILL "$(cat "$f")" 2>/dev/null || true
    done
    for f in "$dir"/pid.*; do
        [ -f "$f" ] || continue
        while kill -0 "$(cat "$f")" 2>/dev/null; do sleep 0.05; done
    done
    rm -rf "$dir"
}

cli() {
    local dir=$1; shift
    "$FDB_CLI" -C "$dir/fdb.cluster" --timeout 10 --exec "$*"
}

wait_available() {
    local dir=$1 deadline=$((SECONDS + 90))
    while [ $SECONDS -lt $deadline ]; do
        if cli "$dir" "status minimal" 2>/dev/null | grep -q "The database is available"; then
            return 0
        fi
        sleep 0.5
    done
    return 1
}

start_cluster() {
    local procs=$1 dir i ports=() coords="" mode
    need_fdb
    case "$procs" in 1) mode=single ;; 3) mode=double ;; *) die "--procs is 1 or 3, not $procs" ;; esac
    dir=$(mktemp -d "${TMPDIR:-/tmp}/couch_workers_fdb.XXXXXX")
    # On any failure below, leave nothing behind.
    trap 'stop_cluster "$dir"' ERR
    for ((i = 0; i < procs; i++)); do
        ports+=("$(free_port "$i")")
        echo "${ports[$i]}" >"$dir/port.$i"
        coords+="${coords:+,}127.0.0.1:${ports[$i]}"
    done
    echo "cw$(basename "$dir" | tr -dc 'a-zA-Z0-9'):cw$RANDOM@$coords" >"$dir/fdb.cluster"
    for ((i = 0; i < procs; i++)); do start_proc "$dir" "$i"; done
    local ok=""
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        if cli "$dir" "configure new $mode memory" >"$dir/configure.out" 2>&1; then ok=yes; break; fi
        grep -q "Database already exists" "$dir/configure.out" && { ok=yes; break; }
        for ((i = 0; i < procs; i++)); do
            kill -0 "$(cat "$dir/pid.$i")" 2>/dev/null || {
                cat "$dir/server.$i.out" >&2
                local taken=""
                grep -q "Local address in use" "$dir/server.$i.out" && taken=yes
                stop_cluster "$dir"
                if [ -n "$taken" ] && [ "$start_attempt" -lt 3 ]; then
                    # Another process (another test run's cluster) bound the
                    # port after free_port found it free: start again on
                    # other ports.
                    echo "fdb-cluster: port ${ports[$i]} was taken meanwhile; starting again on other ports" >&2
                    trap - ERR
                    start_attempt=$((start_attempt + 1))
                    start_cluster "$procs"
                    return
                fi
                die "fdbserver $i exited at start (port ${ports[$i]})"
            }
        done
        sleep 1
    done
    if [ -z "$ok" ] || ! wait_available "$dir"; then
        cat "$dir/configure.out" >&2 || true
        stop_cluster "$dir"
        die "the cluster did not become available within 90 s"
    fi
    trap - ERR
    echo "FDB_CLUSTER_FILE=$dir/fdb.cluster"
    echo "FDB_CLUSTER_DIR=$dir"
}

parse_procs() {
    procs=1
    if [ "${1:-}" = --procs ]; then procs=${2:?--procs needs a number}; shift_by=2; else shift_by=0; fi
}

cmd=${1:-}
[ -n "$cmd" ] && shift
case "$cmd" in
    start)
        parse_procs "$@"
        start_cluster "$procs"
        ;;
    stop)
        stop_cluster "${1:?stop needs the cluster directory}"
        ;;
    kill)
        dir=${1:?kill needs the cluster directory} i=${2:?kill needs a process number}
        kill "-${3:-KILL}" "$(cat "$dir/pid.$i")"
        ;;
    restart)
        need_fdb
        dir=${1:?restart needs the cluster directory} i=${2:?restart needs a process number}
        start_proc "$dir" "$i"
        ;;
    run)
        parse_procs "$@"
        shift "$shift_by"
        [ "${1:-}" = -- ] && shift
        [ $# -gt 0 ] || die "run needs a command after --"
        assignments=$(start_cluster "$procs")
        eval "$assignments"
        export FDB_CLUSTER_FILE FDB_CLUSTER_DIR
        trap 'stop_cluster "$FDB_CLUSTER_DIR"' EXIT
        trap 'exit 130' INT TERM
        echo "fdb-cluster: $procs process(es), cluster file $FDB_CLUSTER_FILE (FoundationDB: $FDB_WHERE)" >&2
        rc=0
        "$@" || rc=$?
        exit "$rc"
        ;;
    *)
        sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
        exit 2
        ;;
esac
