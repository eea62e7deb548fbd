#!/usr/bin/env bash
# Start a Prefect 3 server and a process worker polling the `probepo` work pool (created if missing), from
# this repository's venv, state under $PROBEPO_PREFECT_DIR (default /tmp/probepo-prefect). Stdout:
# `export` lines only (eval "$(bash infra/prefect/start.sh)"); idempotent: when it already answers, it
# just prints them.
# The database (docs/PREFECT.md):
#   default                   PostgreSQL, a cluster of its own (infra/prefect/postgres.sh: $STATE/postgres,
#                             127.0.0.1:$PROBEPO_PREFECT_DB_PORT, default 14201), started first;
#   PROBEPO_PREFECT_DB=sqlite SQLite in $STATE/home: single-user, fine for one person on a laptop, not for a
#                             team ("database is locked" when flow runs are created concurrently);
#   PREFECT_SERVER_DATABASE_CONNECTION_URL set: that database, as it is; no PostgreSQL of ours starts.
# The API always requires basic authentication — even on loopback, which every user of a shared login node
# reaches: PREFECT_SERVER_API_AUTH_STRING=user:password if set, else one generated once per state folder
# (kept 0600 in $STATE/auth); clients get it as PREFECT_API_AUTH_STRING from the printed exports.
# PROBEPO_PREFECT_HOST=0.0.0.0 listens beyond loopback. The worker: infra/prefect/worker.sh, its pid and log
# in $STATE. PROBEPO_PREFECT_FRESH=1 gives a cold start an empty database (scripts/services.sh start --fresh).
set -euo pipefail
# shellcheck source=procs.sh
source "$(dirname "${BASH_SOURCE[0]}")/procs.sh"
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
STATE=${PROBEPO_PREFECT_DIR:-/tmp/probepo-prefect}
PORT=${PROBEPO_PREFECT_PORT:-14200}
PREFECT=${PREFECT:-.venv/bin/prefect}
PYTHON=${PYTHON:-.venv/bin/python}
HOST=${PROBEPO_PREFECT_HOST:-127.0.0.1}
API="http://127.0.0.1:$PORT/api"
# Where the UI in a browser finds the API (else it looks on Prefect's default port, 4200).
if [[ $HOST == 127.0.0.1 || $HOST == localhost ]]; then
  UI_API=${PREFECT_UI_API_URL:-$API}
else
  UI_API=${PREFECT_UI_API_URL:-http://$(hostname -f 2>/dev/null || hostname):$PORT/api}
fi
healthy() { "$PYTHON" -c "import urllib.request; urllib.request.urlopen('$API/health', timeout=2)" 2>/dev/null; }
print_env() {
  echo "export PREFECT_API_URL=$API"
  printf 'export PREFECT_API_AUTH_STRING=%q\n' "$(cat "$STATE/auth")"
  echo "export PREFECT_HOME=$STATE/home"
  echo "export PREFECT_SERVER_ANALYTICS_ENABLED=false"
}

mkdir -p "$STATE/home"
if [[ -n ${PREFECT_SERVER_API_AUTH_STRING:-} ]]; then
  [[ $PREFECT_SERVER_API_AUTH_STRING == *:* ]] || {
    echo "probepo-prefect: PREFECT_SERVER_API_AUTH_STRING must be user:password" >&2
    exit 2
  }
  (umask 077; printf '%s' "$PREFECT_SERVER_API_AUTH_STRING" >"$STATE/auth")
elif [[ ! -s $STATE/auth ]]; then
  (umask 077; printf 'probepo:%s' "$(head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')" >"$STATE/auth")
fi
AUTH=$(cat "$STATE/auth")
start_worker() {
  PROBEPO_WORKER_DIR=$STATE PROBEPO_WORKER_NAME=probepo-worker PREFECT=$PREFECT \
    PREFECT_API_URL=$API PREFECT_API_AUTH_STRING=$AUTH PREFECT_HOME=$STATE/home \
    PREFECT_WORKER_QUERY_SECONDS=${PROBEPO_PREFECT_POLL_S:-2} bash infra/prefect/worker.sh start
}
if alive "$STATE/server.pid" && healthy; then
  start_worker
  print_env
  exit 0
fi
FRESH=${PROBEPO_PREFECT_FRESH:-0}
if [[ -n ${PREFECT_SERVER_DATABASE_CONNECTION_URL:-} ]]; then
  DB="database of PREFECT_SERVER_DATABASE_CONNECTION_URL"
  [[ $FRESH != 1 ]] || echo "probepo-prefect: PROBEPO_PREFECT_FRESH=1 ignored: that database is not ours" >&2
elif [[ ${PROBEPO_PREFECT_DB:-postgres} == sqlite ]]; then
  if [[ $FRESH == 1 ]]; then
    # A cold start for the tests: the SQLite database of an earlier server goes, with its flow runs.
    rm -f "$STATE"/home/prefect.db*
    echo "probepo-prefect: starting on an empty database (PROBEPO_PREFECT_FRESH=1)" >&2
  fi
  DB="SQLite in $STATE/home (PROBEPO_PREFECT_DB=sqlite: single-user)"
elif [[ ${PROBEPO_PREFECT_DB:-postgres} == postgres ]]; then
  bash infra/prefect/postgres.sh start  # PROBEPO_PREFECT_FRESH=1: the database is emptied
  PREFECT_SERVER_DATABASE_CONNECTION_URL=$(bash infra/prefect/postgres.sh url)
  export PREFECT_SERVER_DATABASE_CONNECTION_URL  # the server's environment only, never printed
  DB="PostgreSQL ($STATE/postgres)"
else
  echo "probepo-prefect: PROBEPO_PREFECT_DB must be postgres (the default) or sqlite" >&2
  exit 2
fi
PREFECT_HOME=$STATE/home PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_UI_SHOW_PROMOTIONAL_CONTENT=false \
  PREFECT_SERVER_API_AUTH_STRING=$AUTH PREFECT_SERVER_API_PORT=$PORT PREFECT_UI_API_URL=$UI_API \
  setsid "$PREFECT" server start --host "$HOST" --port "$PORT" --analytics-off </dev/null \
  >"$STATE/server.log" 2>&1 &
echo $! >"$STATE/server.pid"
for _ in $(seq 1 300); do
  if healthy; then
    echo "probepo-prefect: Prefect server up on $API, UI http://127.0.0.1:$PORT, $DB (log $STATE/server.log)" >&2
    start_worker
    print_env
    exit 0
  fi
  kill -0 "$(cat "$STATE/server.pid")" 2>/dev/null || break
  sleep 0.2
done
echo "probepo-prefect: the Prefect server did not answer on $API within 60 s; its log ($STATE/server.log):" >&2
tail -20 "$STATE/server.log" >&2 || true
exit 1
