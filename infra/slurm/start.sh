#!/usr/bin/env bash
# Start a SLURM 22.05 cluster with accounting (munged, MariaDB, slurmdbd, slurmctld, slurmd), all
# configured and kept under one state folder (${PROBEPO_SLURM_DIR:-/tmp/probepo-slurm}). One node by
# default; PROBEPO_SLURM_NODES=2 (up to 4) runs one slurmd per node on this machine, each with its own
# name, port, spool folder and 8 fake GPUs, node 1 alone in the partitions low, high and short, and every
# node in the partition wide (multi-node jobs).
# Stdout: only `export VAR=value` lines, so `eval "$(bash infra/slurm/start.sh)"` works; the rest
# goes to stderr. Idempotent: when every daemon is already up it just prints the environment.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
source "$HERE/common.sh"

export SLURM_CONF=$SLURM_CONF_FILE

cluster_state() { # sets all_up and any_up from the pid files
  all_up=1 any_up=0
  local d
  for d in "${DAEMONS[@]}"; do
    if live_pid "$d" >/dev/null; then any_up=1; else all_up=0; fi
  done
}
# Already up: print the environment. Needs no root, so any user can get it.
cluster_state
if [[ $all_up -eq 1 ]]; then
  log "already running (state in $STATE)"
  print_env
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  log "start.sh must run as root (daemons run as root, munged as the munge user, mknod)"
  exit 1
fi
for bin in munged mariadbd mariadb-install-db slurmdbd slurmctld slurmd sbatch sacctmgr; do
  command -v "$bin" >/dev/null || { log "$bin not found: run infra/slurm/install.sh first"; exit 1; }
done

mkdir -p "$STATE"
chmod 755 "$STATE"
# Serialise concurrent start/stop calls (e.g. several test workers) on one state folder.
# Daemons are started with 9>&- so that they do not inherit (and hold) the lock.
exec 9>"$STATE/.lock"
flock 9
# Another caller may have started the cluster while we waited for the lock.
cluster_state
if [[ $all_up -eq 1 ]]; then
  log "already running (state in $STATE)"
  print_env
  exit 0
fi
if [[ $any_up -eq 1 ]]; then
  # A half-running cluster (a daemon crashed) is restarted whole: simpler than repairing it.
  log "partly running: stopping the rest first"
  PROBEPO_SLURM_DIR=$STATE PROBEPO_SLURM_LOCKED=1 bash "$HERE/stop.sh" >&2
fi

# slurmd does not create its %n spool folder itself (then logs errors about its socket and hwloc).
mkdir -p "$ETC" "$RUN" "$LOG" "$STATE/ctld" "$STATE/dev" "$STATE/jobs" "${NODE_NAMES[@]/#/$STATE/spool/}"
echo "$NODE_COUNT" >"$NODES_FILE"
echo "$PREEMPT" >"$PREEMPT_FILE"
# Jobs may be submitted by non-root users (when started via sudo): let them write job files here.
chmod 1777 "$STATE/jobs"

HOST=$(hostname -s 2>/dev/null || uname -n)
HOST=${HOST%%.*}

# ---- fake GPUs: character devices equal to /dev/null (1,3). slurmd only stat()s gres files. ----
GPU_COUNT=$((8 * NODE_COUNT))
make_gpus() {
  local dir=$1 prefix=$2 i f
  for ((i = 0; i < GPU_COUNT; i++)); do
    f=$dir/$prefix$i
    [[ -c $f ]] || { rm -f "$f"; mknod -m 666 "$f" c 1 3 2>/dev/null || return 1; }
    # A nodev mount makes the node exist but unusable: opening it is the real test.
    : <"$f" 2>/dev/null || return 1
  done
}
if make_gpus "$STATE/dev" fakegpu; then
  GPU_PREFIX="$STATE/dev/fakegpu"
else
  log "cannot use device nodes under $STATE (nodev?): using /dev/probepo-fakegpu*"
  rm -f "$STATE"/dev/fakegpu*
  make_gpus /dev probepo-fakegpu
  GPU_PREFIX="/dev/probepo-fakegpu"
fi

# ---- munge: own key, socket and daemon, so a system munged (if any) is left alone. ----
mkdir -p "$MUNGE_DIR"
chown munge:munge "$MUNGE_DIR"
# munged refuses directories writable by others; clients (any user) need to reach the socket.
chmod 755 "$MUNGE_DIR"
if [[ ! -s $MUNGE_DIR/munge.key ]]; then
  log "creating a munge key"
  if command -v mungekey >/dev/null; then
    mungekey --create --keyfile="$MUNGE_DIR/munge.key" --force
  else
    dd if=/dev/urandom of="$MUNGE_DIR/munge.key" bs=1024 count=1 status=none
  fi
fi
chown munge:munge "$MUNGE_DIR/munge.key"
chmod 400 "$MUNGE_DIR/munge.key"

# ---- MariaDB password for the slurm DB user (random once per state folder; loopback only). ----
if [[ ! -s $ETC/dbpass ]]; then
  (umask 077; head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$ETC/dbpass")
fi
DBPASS=$(cat "$ETC/dbpass")

# ---- slurm.conf ----
# One line per node. Every node is this machine (127.0.0.1), so each slurmd gets its own port; a node
# name that is only SLURM's resolves through NodeHostname=localhost (slurmd -N picks its own entry).
node_lines() {
  local i name
  for ((i = 1; i <= NODE_COUNT; i++)); do
    name=${NODE_NAMES[i - 1]}
    printf 'NodeName=%s NodeHostname=localhost NodeAddr=127.0.0.1 Port=%s CPUs=16 Boards=1' "$name" "$(node_port "$i")"
    printf ' SocketsPerBoard=1 CoresPerSocket=16 ThreadsPerCore=1 RealMemory=65536 Gres=gpu:8 State=UNKNOWN\n'
  done
}
wide_partition() {
  ((NODE_COUNT > 1)) || return 0
  local all
  all=$(IFS=,; echo "${NODE_NAMES[*]}")
  echo "# wide: every node, for jobs of several nodes (the other partitions hold node 1 alone)."
  echo "PartitionName=wide Nodes=$all PriorityTier=1 GraceTime=60 MaxTime=INFINITE State=UP"
}
# Preemption, either way (PROBEPO_SLURM_PREEMPT): the job's --signal (e.g. USR2) is sent at preemption only
# with preempt_send_user_signal, which must be under SlurmctldParameters (under SchedulerParameters it is
# silently ignored).
preemption_lines() {
  if [[ $PREEMPT == qos ]]; then
    cat <<EOF
# By QOS (preempt/qos): jobs of QOS urgent requeue jobs of QOS standby (the default QOS), after standby's
# GraceTime of 60 s; the partitions' GraceTime (0) plays no part. Accounting enforces the QOS.
PreemptType=preempt/qos
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
AccountingStorageEnforce=associations,limits,qos
EOF
  else
    cat <<EOF
# By partition: jobs in "high" requeue jobs in "low".
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
EOF
  fi
}
partition_lines() {
  if [[ $PREEMPT == qos ]]; then
    echo "# GraceTime=0: under preempt/qos a preempted job's grace is its QOS's (standby: 60 s)."
    echo "PartitionName=batch Nodes=$NODE Default=YES GraceTime=0 MaxTime=INFINITE State=UP"
    return 0
  fi
  cat <<EOF
# GraceTime=60: a preempted job has 60 s between its signal and the kill (then requeue): at least every
# test profile's signal_grace_s (the default 60), which probepo check requires of a preemptable partition.
PartitionName=low Nodes=$NODE Default=YES PriorityTier=1 GraceTime=60 MaxTime=INFINITE State=UP
PartitionName=high Nodes=$NODE PriorityTier=2 PreemptMode=OFF MaxTime=INFINITE State=UP
# short: at most an hour a job (what probepo check compares a stage's time limit with in the tests).
PartitionName=short Nodes=$NODE PriorityTier=1 GraceTime=60 MaxTime=60 State=UP
EOF
}
# Timeouts and intervals are short so that tests see state changes within seconds.
cat >"$ETC/slurm.conf.new" <<EOF
# Generated by infra/slurm/start.sh: do not edit (regenerated at every start).
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
# Root daemons: simplest in CI (no slurm user, no file ownership to manage).
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire=5: a requeued job may start again after ~5 s instead of 121 s.
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=5
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
MpiDefault=none
# No cgroups (containers, CI): nothing enforces memory, CPU or GPU limits.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Else a job without --mem takes the whole node's memory.
DefMemPerCPU=256
# Lets the node advertise more CPUs/memory than the machine has.
SlurmdParameters=config_overrides
# Impossible requests (e.g. 9 GPUs) fail at submit instead of pending forever.
EnforcePartLimits=ALL
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1,batch_sched_delay=0
JobRequeue=1
MaxArraySize=100
# Fast turnover for tests.
MinJobAge=30
KillWait=5
InactiveLimit=0
Waittime=0
SlurmctldTimeout=10
SlurmdTimeout=30
MessageTimeout=10
BatchStartTimeout=10
UnkillableStepTimeout=60
# A node set DOWN by an admin (our drill) stays DOWN until "state=resume".
ReturnToService=1
$(preemption_lines)
# Accounting through slurmdbd (sacct).
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
# For slurmdbd connections clients take the munge socket from here, not from AuthInfo.
AccountingStoragePass=$MUNGE_SOCKET
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=10
# Fake GPUs (see gres.conf).
GresTypes=gpu
$(node_lines)
$(partition_lines)
$(wide_partition)
EOF
mv "$ETC/slurm.conf.new" "$ETC/slurm.conf"
chmod 644 "$ETC/slurm.conf"

# Without File= a Count-only GPU gres breaks the node; AutoDetect=off: there is no NVML.
{
  echo "AutoDetect=off"
  for ((i = 1; i <= NODE_COUNT; i++)); do
    echo "NodeName=${NODE_NAMES[i - 1]} Name=gpu File=$GPU_PREFIX[$((8 * i - 8))-$((8 * i - 1))]"
  done
} >"$ETC/gres.conf"
chmod 644 "$ETC/gres.conf"

# slurmdbd reads slurmdbd.conf next to SLURM_CONF; it must be 0600 and owned by SlurmUser.
(umask 077; cat >"$ETC/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=$HOST
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
# TCP on loopback: slurmdbd cannot be pointed at a custom unix socket.
StorageHost=127.0.0.1
StoragePort=$MYSQL_PORT
StorageUser=slurm
StoragePass=$DBPASS
StorageLoc=slurm_acct_db
EOF
)
chmod 600 "$ETC/slurmdbd.conf"

# No spank plugins: an empty plugstack keeps Debian's /etc/slurm one out of the picture.
: >"$ETC/plugstack.conf"

wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2 deadline
  shift 2
  deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "timed out after ${limit}s waiting for $what (logs in $LOG)"
      return 1
    fi
    sleep 0.2
  done
}

# ---- munged ----
log "starting munged"
runuser -u munge -- munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE_DIR/munge.key" \
  --pid-file="$MUNGE_DIR/munged.pid" --log-file="$MUNGE_DIR/munged.log" \
  --seed-file="$MUNGE_DIR/munged.seed" --force 9>&-
munge_ok() { munge -n -S "$MUNGE_SOCKET" | unmunge -S "$MUNGE_SOCKET"; }
wait_for 10 munged munge_ok

# ---- MariaDB: own datadir and socket; --no-defaults keeps /etc/mysql out. ----
# Durability is traded for speed (a test database): no fsync, no doublewrite. Sizes are the
# smallest slurmdbd does not warn about (log file >= 32M, lock wait 900 s), except the buffer pool.
INNODB_OPTS=(--innodb-log-file-size=32M --innodb-doublewrite=0 --innodb-flush-log-at-trx-commit=0
  --innodb-flush-method=O_DIRECT_NO_FSYNC)
MYSQL_OPTS=(--no-defaults --datadir="$MYSQL_DIR" --socket="$MYSQL_SOCKET" --port="$MYSQL_PORT"
  --bind-address=127.0.0.1 --skip-name-resolve --pid-file="$RUN/mariadbd.pid"
  --log-error="$LOG/mariadb.log" --user=root --innodb-buffer-pool-size=128M "${INNODB_OPTS[@]}"
  --skip-log-bin --innodb-lock-wait-timeout=900 --max-connections=100)
if [[ ! -d $MYSQL_DIR/mysql ]]; then
  log "initialising MariaDB in $MYSQL_DIR"
  rm -rf "$MYSQL_DIR"
  mariadb-install-db --no-defaults --datadir="$MYSQL_DIR" --user=root \
    --auth-root-authentication-method=socket --skip-test-db --skip-name-resolve "${INNODB_OPTS[@]}" \
    >"$LOG/mariadb-install.log" 2>&1 || { log "mariadb-install-db failed: see $LOG/mariadb-install.log"; exit 1; }
fi
log "starting mariadbd"
setsid mariadbd "${MYSQL_OPTS[@]}" </dev/null >>"$LOG/mariadb.log" 2>&1 9>&- &
# shellcheck disable=SC2120  # wait_for passes the arguments
sql() { mariadb --no-defaults --socket="$MYSQL_SOCKET" -u root "$@"; }
wait_for 30 mariadbd sql -e 'SELECT 1'
sql <<EOF
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DBPASS';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DBPASS';
GRANT ALL PRIVILEGES ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
FLUSH PRIVILEGES;
EOF

# ---- slurmdbd (daemonises; creates its tables on first start) ----
# slurmdbd can exit within a second of its start while MariaDB has only just come up (seen in CI with six
# clusters starting at once: "We should have gotten a result", then "fatal: Unable to initialize
# accounting_storage/mysql"): start it again, as systemd's Restart=on-failure would, up to three times.
start_slurmdbd() {
  local attempt started
  for attempt in 1 2 3; do
    log "starting slurmdbd"
    rm -f "$(pidfile_of slurmdbd)"
    slurmdbd 9>&-
    started=$SECONDS
    until sacctmgr -n list cluster >/dev/null 2>&1; do
      # The pid file appears once slurmdbd has daemonised: give it two seconds before calling it gone.
      if ((SECONDS - started >= 2)) && ! live_pid slurmdbd >/dev/null; then
        log "slurmdbd exited at start (attempt $attempt); the end of $LOG/slurmdbd.log:"
        tail -n 4 "$LOG/slurmdbd.log" >&2
        continue 2
      fi
      if ((SECONDS - started >= 60)); then
        log "timed out after 60s waiting for slurmdbd; the end of $LOG/slurmdbd.log:"
        tail -n 8 "$LOG/slurmdbd.log" >&2
        return 1
      fi
      sleep 0.2
    done
    return 0
  done
  return 1
}
start_slurmdbd

# Register the cluster before slurmctld starts so that it registers with slurmdbd at once.
if [[ -z $(sacctmgr -n -P list cluster "$CLUSTER" format=cluster) ]]; then
  log "registering cluster $CLUSTER in accounting"
  sacctmgr -i add cluster "$CLUSTER" >&2
fi
if [[ -z $(sacctmgr -n -P list account "$CLUSTER" format=account) ]]; then
  sacctmgr -i add account "$CLUSTER" cluster="$CLUSTER" description="probepo tests" organization=probepo >&2
fi
if [[ -z $(sacctmgr -n -P list assoc cluster="$CLUSTER" account="$CLUSTER" user=root format=user) ]]; then
  sacctmgr -i add user root account="$CLUSTER" cluster="$CLUSTER" >&2
fi
if [[ $PREEMPT == qos ]]; then # GraceTime in seconds; sacctmgr prints it back as 00:01:00
  for spec in "standby GraceTime=60 PreemptMode=requeue" "urgent Preempt=standby"; do
    name=${spec%% *}
    if [[ -z $(sacctmgr -n -P list qos where name="$name" format=name) ]]; then
      # shellcheck disable=SC2086  # the spec's words are sacctmgr's
      sacctmgr -i add qos $spec >&2
    fi
  done
  sacctmgr -i modify user where name=root cluster="$CLUSTER" set qos=normal,standby,urgent defaultqos=standby >&2 || true
fi

# ---- slurmctld, slurmd ----
log "starting slurmctld"
slurmctld 9>&-
wait_for 30 slurmctld scontrol ping
for name in "${NODE_NAMES[@]}"; do
  log "starting slurmd -N $name"
  slurmd -N "$name" 9>&-
done
# This is a cold start: jobs the controller recovers from its saved state belong to a cluster that died
# without stop.sh (killed, a machine snapshot); their processes went with it, and one recorded as running
# would hold the node (state mixed) for ever. Cancel them; their records stay in sacct.
leftover=$(squeue -h -o %i | tr '\n' ' ')
if [[ -n ${leftover// /} ]]; then
  log "cancelling jobs recovered from the previous cluster's state: $leftover"
  # shellcheck disable=SC2086  # one id per word
  scancel $leftover
fi
# scontrol, not sinfo: after such a cancel sinfo went on printing "mixed" from a cached node table.
node_idle() { [[ $(scontrol -o show node "$1") == *" State=IDLE "* ]]; }
for name in "${NODE_NAMES[@]}"; do
  wait_for 30 "node $name idle" node_idle "$name"
done
wait_for 30 sacct sacct -n -X -a -S now
# Readable pid files let any user run start.sh (prints the env) and check.sh.
chmod 644 "$RUN"/*.pid "$MUNGE_DIR/munged.pid"

print_env >"$STATE/env.sh"
log "cluster $CLUSTER up; nodes ${NODE_NAMES[*]}; logs in $LOG"
print_env
