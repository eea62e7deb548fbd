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
# How many nodes (slurmd daemons on this machine, each with its own name, port, spool folder and 8 fake
# GPUs): PROBEPO_SLURM_NODES at start (default 1); later calls (stop, check) read what start saved.
NODES_FILE=$STATE/nodes
NODE_COUNT=${PROBEPO_SLURM_NODES:-$(cat "$NODES_FILE" 2>/dev/null || echo 1)}
if ! [[ $NODE_COUNT =~ ^[1-4]$ ]]; then
  echo "probepo-slurm: PROBEPO_SLURM_NODES must be 1 to 4, not '$NODE_COUNT'" >&2
  exit 2
fi
# How jobs are preempted: PROBEPO_SLURM_PREEMPT at start, `partition` (the default: by the partitions'
# priority tiers, each with its own GraceTime) or `qos` (by the jobs' QOS, whose GraceTime then counts and the
# partition's does not, as on sites that preempt by QOS); later calls read what start saved.
PREEMPT_FILE=$STATE/preempt
PREEMPT=${PROBEPO_SLURM_PREEMPT:-$(cat "$PREEMPT_FILE" 2>/dev/null || echo partition)}
if ! [[ $PREEMPT =~ ^(partition|qos)$ ]]; then
  echo "probepo-slurm: PROBEPO_SLURM_PREEMPT must be partition or qos, not '$PREEMPT'" >&2
  exit 2
fi
# probepo-node1 -> probepo-node2, ...; a name not ending in 1 gets -2, -3, ...
NODE_NAMES=("$NODE")
for ((i = 2; i <= NODE_COUNT; i++)); do
  if [[ $NODE == *1 ]]; then NODE_NAMES+=("${NODE%1}$i"); else NODE_NAMES+=("$NODE-$i"); fi
done
# Non-default ports so that a system SLURM/MariaDB on the same machine does not collide with ours.
PORT_BASE=${PROBEPO_SLURM_PORT_BASE:-16817}
CTLD_PORT=$PORT_BASE
SLURMD_PORT=$((PORT_BASE + 1))
DBD_PORT=$((PORT_BASE + 2))
MYSQL_PORT=$((PORT_BASE + 3))
# Node i > 1 listens on PORT_BASE + 3 + i (16821, ...): the first node takes SlurmdPort.
node_port() { if (($1 == 1)); then echo "$SLURMD_PORT"; else echo $((PORT_BASE + 3 + $1)); fi; }

ETC=$STATE/etc
RUN=$STATE/run
LOG=$STATE/log
MUNGE_DIR=$STATE/munge
MUNGE_SOCKET=$MUNGE_DIR/munge.socket
MYSQL_DIR=$STATE/mysql
MYSQL_SOCKET=$STATE/run/mysqld.sock
SLURM_CONF_FILE=$ETC/slurm.conf

# Daemons in start order; stop.sh walks this list backwards. slurmd@NAME: the slurmd of node NAME.
SLURMDS=("${NODE_NAMES[@]/#/slurmd@}")
DAEMONS=(munged mariadbd slurmdbd slurmctld "${SLURMDS[@]}")

pidfile_of() {
  case $1 in
    munged) echo "$MUNGE_DIR/munged.pid" ;;
    slurmd@*) echo "$RUN/slurmd-${1#slurmd@}.pid" ;; # SlurmdPidFile=.../slurmd-%n.pid
    *) echo "$RUN/$1.pid" ;;
  esac
}

# shellcheck source=../process.sh
source "$(dirname "${BASH_SOURCE[0]}")/../process.sh"

# Prints the pid of daemon $1 (slurmd@NODE: that node's slurmd) if its pid file names a live process of
# that program.
live_pid() { pid_of "$(pidfile_of "$1")" "${1%%@*}"; }

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
    "PROBEPO_SLURM_NODES=$NODE_COUNT" \
    "PROBEPO_SLURM_PREEMPT=$PREEMPT" \
    "PROBEPO_SLURM_CLUSTER=$CLUSTER"; do
    printf 'export %s=%q\n' "${line%%=*}" "${line#*=}"
  done
}
