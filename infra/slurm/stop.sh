#!/usr/bin/env bash
# Stop the cluster started by start.sh: cancel its jobs, stop slurmd, slurmctld, slurmdbd,
# mariadbd and munged by their pid files, then kill any slurmstepd (and job process) of this
# cluster that is left. Idempotent: exits 0 when nothing runs.
# Usage: stop.sh [--wipe]   (--wipe also deletes the state folder: config, DB, job history)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
source "$HERE/common.sh"

wipe=0
for arg in "$@"; do
  case $arg in
    --wipe) wipe=1 ;;
    -h | --help) sed -n '2,6p' "$0"; exit 0 ;;
    *) log "unknown argument: $arg"; exit 2 ;;
  esac
done

if [[ ! -d $STATE ]]; then
  log "nothing to stop ($STATE does not exist)"
  exit 0
fi
if [[ ${PROBEPO_SLURM_LOCKED:-0} != 1 ]]; then
  exec 9>"$STATE/.lock"
  flock 9
fi
export SLURM_CONF=$SLURM_CONF_FILE

# Pids of this cluster's slurmstepd processes (recognised by our SLURM_CONF in their
# environment, inherited from slurmd) and of all their descendants (the jobs' processes).
our_job_pids() {
  local pid steps=()
  for pid in $(pgrep -x slurmstepd || true); do
    if { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | grep -qxF "SLURM_CONF=$SLURM_CONF_FILE"; then
      steps+=("$pid")
    fi
  done
  [[ ${#steps[@]} -gt 0 ]] || return 0
  ps -e -o pid=,ppid= | awk -v roots="${steps[*]}" '
    BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1 }
    { parent[$1] = $2 }
    END {
      do { grew = 0
        for (p in parent) if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; grew = 1 }
      } while (grew)
      for (p in keep) print p
    }'
}

wait_gone() { # wait_gone SECONDS PID...
  local deadline=$((SECONDS + $1)) pid left
  shift
  while :; do
    left=0
    for pid in "$@"; do live "$pid" && left=1; done
    [[ $left -eq 0 ]] && return 0
    ((SECONDS >= deadline)) && return 1
    sleep 0.1
  done
}

stopped_any=0
# Cancel jobs first: slurmd exiting leaves running jobs (and their slurmstepd) behind.
if pid=$(live_pid slurmctld); then
  jobs=$(timeout 10 squeue -h -o %A 2>/dev/null || true)
  if [[ -n $jobs ]]; then
    log "cancelling jobs: ${jobs//$'\n'/ }"
    # shellcheck disable=SC2086
    timeout 10 scancel $jobs 2>/dev/null || true
    # KillWait=5: tasks get SIGTERM, then SIGKILL 5 s later.
    mapfile -t steps < <(our_job_pids)
    [[ ${#steps[@]} -eq 0 ]] || wait_gone 10 "${steps[@]}" || true
  fi
fi

# Stop in dependency order; daemons in one group stop in parallel:
# slurmctld flushes accounting to slurmdbd, slurmdbd needs MariaDB; munged goes last.
stop_group() {
  local d pid pids=() limit=15
  for d in "$@"; do
    if pid=$(live_pid "$d"); then
      log "stopping $d (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
      # MariaDB flushes InnoDB on shutdown: give it longer before resorting to SIGKILL.
      [[ $d == mariadbd ]] && limit=60
    fi
  done
  if [[ ${#pids[@]} -gt 0 ]]; then
    if ! wait_gone "$limit" "${pids[@]}"; then
      log "$* did not exit after ${limit}s: SIGKILL"
      kill -KILL "${pids[@]}" 2>/dev/null || true
      wait_gone 5 "${pids[@]}" || true
    fi
    stopped_any=1
  fi
  for d in "$@"; do rm -f "$(pidfile_of "$d")"; done
}
stop_group "${SLURMDS[@]}" slurmctld
stop_group slurmdbd
stop_group mariadbd munged

mapfile -t left < <(our_job_pids)
if [[ ${#left[@]} -gt 0 ]]; then
  log "killing leftover slurmstepd/job processes: ${left[*]}"
  kill -KILL "${left[@]}" 2>/dev/null || true
  wait_gone 5 "${left[@]}" || true
  stopped_any=1
fi

if [[ $stopped_any -eq 1 ]]; then log "stopped"; else log "nothing was running"; fi

if [[ $wipe -eq 1 ]]; then
  log "wiping $STATE"
  # Fallback fake GPU devices (state folder on a nodev mount), if this cluster used them.
  fallback=0
  grep -qs 'File=/dev/probepo-fakegpu' "$ETC/gres.conf" && fallback=1
  rm -rf "$STATE"
  [[ $fallback -eq 0 ]] || rm -f /dev/probepo-fakegpu*
fi
