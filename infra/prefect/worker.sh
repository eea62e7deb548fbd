#!/usr/bin/env bash
# A Prefect process worker on the `probepo` pool (created if missing), from this checkout's venv (PREFECT:
# another `prefect`), against the server PREFECT_API_URL names: the local one of infra/prefect/start.sh
# (which starts its worker with this script), a team's server (with PREFECT_API_AUTH_STRING) or Prefect
# Cloud (with PREFECT_API_KEY). Its flow runs submit the SLURM jobs: on a cluster, run it on a login node.
#   start   start it in the background; a no-op when it runs, so cron can keep it alive:
#             */5 * * * * /path/to/probepo/infra/prefect/worker.sh start
#   stop    stop it with its flow-run processes; idempotent.
#   status  say whether it runs (exit 0) or not (exit 3).
#   run     run it in the foreground (a systemd --user unit's ExecStart; docs/PREFECT.md).
# State in PROBEPO_WORKER_DIR (default ~/.probepo/worker): worker.HOST.pid and worker.HOST.log, HOST the
# short host name (a home folder shared by several login nodes keeps one worker per node apart), and an
# optional `env` file (mode 0600) sourced first, its assignments winning over the environment: where cron
# and systemd, which start with an empty environment, find PREFECT_API_URL, the credentials, PATH (the
# SLURM commands), PROBEPO_ROOT. PROBEPO_WORKER_NAME names the worker (default probepo-HOST-USER).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=procs.sh
source "$ROOT/infra/prefect/procs.sh"
DIR=${PROBEPO_WORKER_DIR:-$HOME/.probepo/worker}
HOST=${HOSTNAME:-$(uname -n)}
HOST=${HOST%%.*}
PIDFILE=$DIR/worker.$HOST.pid
LOG=$DIR/worker.$HOST.log
if [[ -f $DIR/env ]]; then
  set -a
  # shellcheck disable=SC1091
  source "$DIR/env"
  set +a
fi
PREFECT=${PREFECT:-$ROOT/.venv/bin/prefect}
NAME=${PROBEPO_WORKER_NAME:-probepo-$HOST-$(id -un)}
say() { echo "probepo-worker: $*" >&2; }
need_api() {
  [[ -n ${PREFECT_API_URL:-} ]] && return 0
  say "set PREFECT_API_URL (+ PREFECT_API_AUTH_STRING for a server with a password, PREFECT_API_KEY for"
  say "Prefect Cloud), in the environment or in $DIR/env;"
  say "for the local server: eval \"\$(bash infra/prefect/start.sh)\""
  exit 2
}
args=(worker start --pool probepo --type process --create-pool-if-not-found --name "$NAME")
cd "$ROOT"

case "${1:-}" in
  start)
    alive "$PIDFILE" && exit 0
    need_api
    mkdir -p "$DIR"
    if [[ $(stat -c %s "$LOG" 2>/dev/null || echo 0) -gt 10000000 ]]; then mv -f "$LOG" "$LOG.1"; fi
    setsid "$PREFECT" "${args[@]}" </dev/null >>"$LOG" 2>&1 &
    echo $! >"$PIDFILE"
    say "worker $NAME polling pool probepo on $PREFECT_API_URL (pid $!, log $LOG)"
    ;;
  run)
    need_api
    exec "$PREFECT" "${args[@]}"
    ;;
  stop)
    stop_group "$PIDFILE"
    ;;
  status)
    if alive "$PIDFILE"; then
      say "running (pid $(cat "$PIDFILE"), log $LOG)"
    else
      say "not running on $HOST (log $LOG)"
      exit 3
    fi
    ;;
  *)
    echo "usage: infra/prefect/worker.sh start | stop | status | run" >&2
    exit 2
    ;;
esac
