#!/usr/bin/env bash
# Start a Prefect 3 server on loopback (SQLite under $PROBEPO_PREFECT_DIR). Stdout: `export` lines only
# (eval "$(bash infra/prefect/start.sh)"); idempotent: when it already answers, it just prints them.
# Beyond loopback, set PREFECT_SERVER_API_AUTH_STRING=user:password (clients: PREFECT_API_AUTH_STRING) and
# --host; PostgreSQL instead of SQLite: PREFECT_SERVER_DATABASE_CONNECTION_URL (see README).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
STATE=${PROBEPO_PREFECT_DIR:-/tmp/probepo-prefect}
PORT=${PROBEPO_PREFECT_PORT:-14200}
PREFECT=${PREFECT:-.venv/bin/prefect}
PYTHON=${PYTHON:-.venv/bin/python}
API="http://127.0.0.1:$PORT/api"
healthy() { "$PYTHON" -c "import urllib.request; urllib.request.urlopen('$API/health', timeout=2)" 2>/dev/null; }
print_env() {
  echo "export PREFECT_API_URL=$API"
  echo "export PREFECT_HOME=$STATE/home"
  echo "export PREFECT_SERVER_ANALYTICS_ENABLED=false"
}

mkdir -p "$STATE/home"
if [[ -s $STATE/server.pid ]] && kill -0 "$(cat "$STATE/server.pid")" 2>/dev/null && healthy; then
  print_env
  exit 0
fi
PREFECT_HOME=$STATE/home PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_UI_SHOW_PROMOTIONAL_CONTENT=false \
  setsid "$PREFECT" server start --host 127.0.0.1 --port "$PORT" --analytics-off </dev/null \
  >"$STATE/server.log" 2>&1 &
echo $! >"$STATE/server.pid"
for _ in $(seq 1 300); do
  if healthy; then
    echo "probepo-prefect: Prefect server up on $API, UI http://127.0.0.1:$PORT (log $STATE/server.log)" >&2
    print_env
    exit 0
  fi
  kill -0 "$(cat "$STATE/server.pid")" 2>/dev/null || break
  sleep 0.2
done
echo "probepo-prefect: the Prefect server did not answer on $API within 60 s; its log ($STATE/server.log):" >&2
tail -20 "$STATE/server.log" >&2 || true
exit 1
