# shellcheck shell=bash
# Sourced by the scripts of infra/prefect (not run): the processes they start in the background, each the
# leader of a process group of its own (setsid), its pid in a file.

# shellcheck source=../process.sh
source "$(dirname "${BASH_SOURCE[0]}")/../process.sh"

# alive PIDFILE: the process the file names runs, and is no recycled pid (its command line names prefect).
alive() {
  local pid
  [[ -s $1 ]] && pid=$(cat "$1") && live "$pid" \
    && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q prefect
}

# stop_group PIDFILE: TERM the process group the file names, wait up to 10 s for its leader, KILL what is
# left of the group (a worker's flow-run subprocesses, the server's services); idempotent.
stop_group() {
  [[ -s $1 ]] || return 0
  local pid
  pid=$(cat "$1")
  if alive "$1"; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
    for _ in $(seq 1 100); do live "$pid" || break; sleep 0.1; done
  fi
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$1"
}
