#!/usr/bin/env bash
# Stop the Prefect server started by infra/prefect/start.sh, and everything in its process group
# (idempotent).
set -euo pipefail
STATE=${PROBEPO_PREFECT_DIR:-/tmp/probepo-prefect}
[[ -s $STATE/server.pid ]] || exit 0
pid=$(cat "$STATE/server.pid")
if kill -0 "$pid" 2>/dev/null; then
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$pid" 2>/dev/null || true
fi
rm -f "$STATE/server.pid"
