# Shared by start.sh, stop.sh and check.sh (sourced, not run): the state folder's layout and
# helpers to find our own daemons by their pid files.
# shellcheck shell=bash disable=SC2034  # the variables are used by the scripts that source this

STATE=${PROBEPO_SLURM_DIR:-/tmp/probepo-slurm}
# slurm.conf cannot quote paths: refuse whitespace rather than write a broken config.
if [[ $STATE =~ [[:space:]] ]]; then
  echo "probepo-slurm: PROBEPO_SLURM_DIR must not contain whitespace: '$STATE'" >&2
  exit 2
fi
STATE=$(realpath -m "$STATE")

CLUSTER=probepo
NODE=${PROBEPO_SLURM_NODE:-probepo-node1}
# Non-default ports so that a system SLURM/MariaDB on the same machine does not collide with ours.
PORT_BASE=${PROBEPO_SLURM_PORT_BASE:-16817}
CTLD_PORT=$PORT_BASE
SLURMD_PORT=$((PORT_BASE + 1))
DBD_PORT=$((PORT_BASE + 2))
MYSQL_PORT=$((PORT_BASE + 3))

ETC=$STATE/etc
RUN=$STATE/run
LOG=$STATE/log
MUNGE_DIR=$STATE/munge
MUNGE_SOCKET=$MUNGE_DIR/munge.socket
MYSQL_DIR=$STATE/mysql
MYSQL_SOCKET=$STATE/run/mysqld.sock
SLURM_CONF_FILE=$ETC/slurm.conf

# Daemons in start order; stop.sh walks this list backwards.
DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd)

pidfile_of() {
  case $1 in
    munged) echo "$MUNGE_DIR/munged.pid" ;;
    *) echo "$RUN/$1.pid" ;;
  esac
}

# shellcheck source=../process.sh
source "$(dirname "${BASH_SOURCE[0]}")/../process.sh"

# Prints the pid of daemon $1 if its pid file names a live process of that program.
# Checking /proc/PID/comm guards against a stale pid file whose pid was reused.
live_pid() {
  local f pid comm
  f=$(pidfile_of "$1")
  [[ -r $f ]] || return 1
  pid=$(tr -dc '0-9' <"$f")
  [[ -n $pid ]] || return 1
  comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
  [[ $comm == "$1"* ]] || return 1
  live "$pid" || return 1
  echo "$pid"
}

_T0=${EPOCHREALTIME/./}
# Log lines carry the seconds since the script started: start-up time is a budget in CI.
log() {
  local us=$((${EPOCHREALTIME/./} - _T0))
  printf 'probepo-slurm [%d.%01ds]: %s\n' $((us / 1000000)) $((us % 1000000 / 100000)) "$*" >&2
}

# What a client shell needs: every client and daemon reads SLURM_CONF (the generated config
# names the munge socket and the ports), never /etc/slurm.
print_env() {
  local line
  for line in \
    "SLURM_CONF=$SLURM_CONF_FILE" \
    "PROBEPO_SLURM_DIR=$STATE" \
    "PROBEPO_SLURM_NODE=$NODE" \
    "PROBEPO_SLURM_CLUSTER=$CLUSTER"; do
    printf 'export %s=%q\n' "${line%%=*}" "${line#*=}"
  done
}
