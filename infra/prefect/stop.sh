#!/usr/bin/env bash
# Stop what infra/prefect/start.sh started: the worker (infra/prefect/worker.sh, with its flow-run
# subprocesses), the server (its process group: its services), then our PostgreSQL (infra/prefect/postgres.sh,
# when there is one); idempotent, leaves no process.
set -euo pipefail
# shellcheck source=procs.sh
source "$(dirname "${BASH_SOURCE[0]}")/procs.sh"
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
STATE=${PROBEPO_PREFECT_DIR:-/tmp/probepo-prefect}
PROBEPO_WORKER_DIR=$STATE bash infra/prefect/worker.sh stop
stop_group "$STATE/worker.pid"  # a worker of an earlier start.sh, before worker.sh
stop_group "$STATE/server.pid"
bash infra/prefect/postgres.sh stop
