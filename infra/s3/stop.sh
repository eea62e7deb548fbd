#!/usr/bin/env bash
# Stop the S3 endpoint started by infra/s3/start.sh (idempotent).
set -euo pipefail
STATE=${PROBEPO_S3_DIR:-/tmp/probepo-s3}
[[ -s $STATE/moto.pid ]] || exit 0
pid=$(cat "$STATE/moto.pid")
if kill -0 "$pid" 2>/dev/null; then
  kill "$pid"
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
fi
rm -f "$STATE/moto.pid"
