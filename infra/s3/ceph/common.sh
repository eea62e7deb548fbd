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
TLS_ENDPOINT=https://127.0.0.1:$RGW_TLS_PORT

# Daemons in start order (stop.sh walks it backwards): name, program.
DAEMONS=(mon.a:ceph-mon osd.0:ceph-osd client.rgw:radosgw)

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
