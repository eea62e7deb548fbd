#!/usr/bin/env bash
# Create (or update) the deployments of prefect.yaml — train (one per recipe preset), resume, evaluate,
# nightly-eval, demo — with the site's defaults (configs/sites/example.yaml) on the
# server PREFECT_API_URL names (with PREFECT_API_AUTH_STRING), for the worker of the `probepo` pool. Flow
# runs start in this checkout (PROBEPO_ROOT, default: the repository this script is in).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
: "${PREFECT_API_URL:?set it: for the local server, eval \"\$(bash infra/prefect/start.sh)\"; for an existing server or Prefect Cloud, set PREFECT_API_URL (+ PREFECT_API_AUTH_STRING or PREFECT_API_KEY)}"
cd "$ROOT"
# prefect.yaml with a train deployment per recipe preset and the site's store, executor and profile in the
# parameters (flows/deployments.py; the site file: --site FILE, $PROBEPO_SITE, or site.yaml here).
GENERATED=$(mktemp --suffix=.yaml)
trap 'rm -f "$GENERATED"' EXIT
"${PYTHON:-.venv/bin/python}" -m flows.deployments "$@" >"$GENERATED"
PROBEPO_ROOT=${PROBEPO_ROOT:-$ROOT} "${PREFECT:-.venv/bin/prefect}" deploy --all --no-prompt --prefect-file "$GENERATED"
# prefect deploy gives every train deployment the flow's full form: fit each to its recipe (flows/forms.py)
"${PYTHON:-.venv/bin/python}" -m flows.deployments --fit-forms "$@"
