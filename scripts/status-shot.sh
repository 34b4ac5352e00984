#!/usr/bin/env bash
# Renders the status page to docs/status-page.png with headless Chromium
# (Debian's `chromium`) while a demo workload runs (scripts/status_shot.escript).
#   scripts/status-shot.sh [PNG]
set -euo pipefail
cd "$(dirname "$0")/.."
png=${1:-$PWD/docs/status-page.png}
if ! command -v chromium >/dev/null 2>&1; then
    echo "status-shot: chromium is not installed (apt-get install -y chromium)" >&2
    exit 1
fi
rebar3 compile
store_dir=$(mktemp -d /tmp/couch_workers_shot.XXXXXX)
trap 'rm -rf "$store_dir"' EXIT
escript scripts/status_shot.escript "$PWD/_build/default/lib/couch_workers/ebin" "$store_dir" 0 "$png"
