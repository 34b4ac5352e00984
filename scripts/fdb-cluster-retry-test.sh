#!/bin/bash
# Checks that scripts/fdb-cluster.sh starts a cluster when a port it
# chose is bound by someone else before its server binds it (two test
# runs at once on one machine did this): a listener holds a port, the
# first process is given it (COUCH_WORKERS_FDB_TAKEN_PORT), and the
# cluster must still come up, on other ports. Exit 0 when it does.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
portfile=$(mktemp)
python3 -c '
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(1)
print(s.getsockname()[1], flush=True)
time.sleep(300)' >"$portfile" &
holder=$!
trap 'kill "$holder" 2>/dev/null || true; rm -f "$portfile"' EXIT
for _ in $(seq 1 50); do [ -s "$portfile" ] && break; sleep 0.1; done
port=$(cat "$portfile")
out=$(COUCH_WORKERS_FDB_TAKEN_PORT=$port "$ROOT/scripts/fdb-cluster.sh" run -- sh -c 'cat "$FDB_CLUSTER_FILE"' 2>&1) || {
    echo "$out" >&2
    echo "fdb-cluster-retry-test: FAILED: no cluster with port $port taken" >&2
    exit 1
}
echo "$out" | grep -q "port $port was taken meanwhile" || { echo "$out" >&2; echo "fdb-cluster-retry-test: FAILED: the taken port was not met" >&2; exit 1; }
echo "$out" | grep "@127.0.0.1:" | grep -vq ":$port" || { echo "$out" >&2; echo "fdb-cluster-retry-test: FAILED: the cluster file names port $port" >&2; exit 1; }
echo "fdb-cluster-retry-test: port $port taken: the cluster started on other ports"
