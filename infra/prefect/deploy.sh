#!/usr/bin/env bash
# Create (or update) the deployments of prefect.yaml — train, resume, evaluate, nightly-eval, demo — on the
# server PREFECT_API_URL names (with PREFECT_API_AUTH_STRING), for the worker of the `probepo` pool. Flow
# runs start in this checkout (PROBEPO_ROOT, default: the repository this script is in).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
: "${PREFECT_API_URL:?set PREFECT_API_URL (and PREFECT_API_AUTH_STRING): eval \"\$(bash infra/prefect/start.sh)\"}"
cd "$ROOT"
PROBEPO_ROOT=${PROBEPO_ROOT:-$ROOT} exec "${PREFECT:-.venv/bin/prefect}" deploy --all --no-prompt
