#!/usr/bin/env bash
# Stop the worker and the server started by infra/prefect/start.sh, each with everything in its process
# group (the worker's flow-run subprocesses, the server's services); idempotent.
set -euo pipefail
STATE=${PROBEPO_PREFECT_DIR:-/tmp/probepo-prefect}
stop_group() {
  [[ -s $STATE/$1.pid ]] || return 0
  local pid
  pid=$(cat "$STATE/$1.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$STATE/$1.pid"
}
stop_group worker
stop_group server
