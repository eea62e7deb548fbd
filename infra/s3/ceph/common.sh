# shellcheck shell=bash disable=SC2034  # the variables are used by the scripts that source this
# Sourced by start.sh and stop.sh (not run): the state folder's layout, ports, the daemons and their pids.

STATE=$(realpath -m "${PROBEPO_CEPH_DIR:-/tmp/probepo-ceph}")
# ceph.conf cannot quote paths: refuse whitespace rather than write a broken config.
if [[ $STATE =~ [[:space:]] ]]; then
  echo "probepo-ceph: PROBEPO_CEPH_DIR must not contain whitespace: '$STATE'" >&2
  exit 2
fi
# Not Ceph's defaults (3300/6789, 7480): a system Ceph on the same machine does not collide with ours.
MON_PORT=${PROBEPO_CEPH_MON_PORT:-16840}
RGW_PORT=${PROBEPO_RGW_PORT:-16841}
RGW_TLS_PORT=${PROBEPO_RGW_TLS_PORT:-16842}
OSD_PORTS=${PROBEPO_CEPH_OSD_PORTS:-16843-16849}
CONF=$STATE/ceph.conf
RUN=$STATE/run
LOG=$STATE/log
ENDPOINT=http://127.0.0.1:$RGW_PORT
# A second gateway on the same cluster (same users, buckets and objects), for the store-outage drills to
# stop and start (gateway.sh) while every other test goes on through the first.
DRILL_RGW_PORT=${PROBEPO_RGW_DRILL_PORT:-16851}
DRILL_ENDPOINT=http://127.0.0.1:$DRILL_RGW_PORT
PYTHON=${PYTHON:-$(dirname "${BASH_SOURCE[0]}")/../../../.venv/bin/python}
TLS_ENDPOINT=https://127.0.0.1:$RGW_TLS_PORT

# Daemons in start order (stop.sh walks it backwards): name, program.
DAEMONS=(mon.a:ceph-mon osd.0:ceph-osd client.rgw:radosgw client.rgw.drill:radosgw)

# shellcheck source=../../process.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../process.sh"

# live_pid NAME:PROGRAM: prints the daemon's pid if its pid file names a live process of that program.
live_pid() { pid_of "$RUN/${1%%:*}.pid" "${1#*:}"; }

_T0=${EPOCHREALTIME/./}
# Log lines carry the seconds since the script started: start-up time is a budget in CI.
log() {
  local us=$((${EPOCHREALTIME/./} - _T0))
  printf 'probepo-ceph [%d.%01ds]: %s\n' $((us / 1000000)) $((us % 1000000 / 100000)) "$*" >&2
}

# stop_daemon NAME:PROGRAM: SIGTERM the daemon its pid file names, SIGKILL after 10 s; nothing if none runs.
stop_daemon() {
  local pid deadline
  pid=$(live_pid "$1") || return 0
  log "stopping ${1%%:*} (pid $pid)"
  kill "$pid" 2>/dev/null || true
  deadline=$((SECONDS + 10))
  while live "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
  if live "$pid"; then
    log "${1%%:*} did not stop within 10 s: killing it"
    kill -9 "$pid" 2>/dev/null || true
    while live "$pid"; do sleep 0.1; done
  fi
}

# start_gateway NAME ENDPOINT: start the radosgw of section NAME of $CONF and wait until it answers on
# ENDPOINT (60 s at most).
start_gateway() {
  local deadline
  radosgw -c "$CONF" -n "$1" 9>&-
  deadline=$((SECONDS + 60))
  until "$PYTHON" -c "import urllib.request; urllib.request.urlopen('$2/', timeout=2)" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      log "the RADOS Gateway $1 did not answer on $2 within 60 s (logs in $LOG)"
      return 1
    fi
    sleep 0.2
  done
}
