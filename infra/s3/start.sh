#!/usr/bin/env bash
# Start the test suite's S3 endpoint: moto's server on loopback, with conditional writes made atomic as
# on real S3 (tests/s3server.py). Stdout: `export` lines only (eval "$(bash infra/s3/start.sh)");
# idempotent: when it already answers, it just prints them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
STATE=${PROBEPO_S3_DIR:-/tmp/probepo-s3}
PORT=${PROBEPO_S3_PORT:-16830}
PYTHON=${PYTHON:-.venv/bin/python}
ENDPOINT="http://127.0.0.1:$PORT"
answers() { "$PYTHON" -c "import urllib.request; urllib.request.urlopen('$ENDPOINT/moto-api/', timeout=1)" 2>/dev/null; }
print_env() { echo "export PROBEPO_TEST_S3_ENDPOINT=$ENDPOINT"; }

mkdir -p "$STATE"
if [[ -s $STATE/moto.pid ]] && kill -0 "$(cat "$STATE/moto.pid")" 2>/dev/null && answers; then
  print_env
  exit 0
fi
setsid "$PYTHON" tests/s3server.py --port "$PORT" </dev/null >"$STATE/moto.log" 2>&1 &
echo $! >"$STATE/moto.pid"
for _ in $(seq 1 150); do
  if answers; then
    echo "probepo-s3: moto S3 server up on $ENDPOINT (log $STATE/moto.log)" >&2
    print_env
    exit 0
  fi
  sleep 0.2
done
echo "probepo-s3: the S3 server did not answer on $ENDPOINT within 30 s (log $STATE/moto.log)" >&2
exit 1
