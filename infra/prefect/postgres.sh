#!/usr/bin/env bash
# The Prefect server's PostgreSQL (infra/prefect/start.sh): a cluster of our own, not Debian's default one,
# in $STATE/postgres ($STATE: PROBEPO_PREFECT_DIR, default /tmp/probepo-prefect), listening on
# 127.0.0.1:$PROBEPO_PREFECT_DB_PORT (default 14201) and on a unix socket in that data folder; a database
# `prefect` owned by the role `probepo`, whose password is generated once into $STATE/db-password (0600).
# TCP connections need that password (scram-sha-256); the socket admits only the cluster's owner (peer).
#   start  initdb on first use, start it (a no-op when it runs), make sure of the role and the database;
#          PROBEPO_PREFECT_FRESH=1 drops the database `prefect` and creates it again, empty. Stdout: nothing.
#   stop   stop it (fast: open sessions end) and leave no postgres process; idempotent.
#   url    print the server's connection URL, postgresql+asyncpg://probepo:PASSWORD@127.0.0.1:PORT/prefect.
# initdb and postgres refuse to run as root: as root, the cluster belongs to and runs as the OS user
# `postgres` (Debian's package creates it; it must be able to reach $STATE); otherwise, to whoever runs
# this (a user on a login node). Binaries: PROBEPO_PG_BIN, else the newest /usr/lib/postgresql/*/bin
# (Debian: infra/prefect/install.sh), else `pg_config --bindir`, else initdb's folder on PATH.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
STATE=$(realpath -m "${PROBEPO_PREFECT_DIR:-/tmp/probepo-prefect}")
cd /  # the postgres user may not enter the folder this was started from
DATA=$STATE/postgres
LOG=$STATE/postgres.log
PWFILE=$STATE/db-password
PORT=${PROBEPO_PREFECT_DB_PORT:-14201}
say() { echo "probepo-postgres: $*" >&2; }

bin_dir() {
  local found
  if [[ -n ${PROBEPO_PG_BIN:-} ]]; then echo "$PROBEPO_PG_BIN"; return; fi
  found=$(find /usr/lib/postgresql -path '*/bin/initdb' 2>/dev/null | sort -V | tail -1)
  if [[ -z $found ]] && command -v pg_config >/dev/null; then
    found=$(pg_config --bindir)/initdb
    [[ -x $found ]] || found=
  fi
  [[ -n $found ]] || found=$(command -v initdb) || {
    say "no PostgreSQL server binaries (initdb): run infra/prefect/install.sh as root, or set PROBEPO_PG_BIN"
    exit 1
  }
  dirname "$found"
}
# The cluster's owner runs its commands: `postgres` when we are root.
as_owner() {
  if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}
give_to_owner() { if [[ $(id -u) -eq 0 ]]; then chown postgres:postgres "$@"; fi; }
running() { [[ -s $DATA/postmaster.pid ]] && as_owner "$(bin_dir)/pg_ctl" status -D "$DATA" >/dev/null 2>&1; }
# A zombie's command line is empty: a postgres that exited counts as gone.
is_postgres() { kill -0 "$1" 2>/dev/null && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q postgres; }
running_port() { sed -n 4p "$DATA/postmaster.pid"; }  # postmaster.pid: pid, data dir, start time, port, …

init_cluster() {
  local bin=$1
  if [[ $(id -u) -eq 0 ]]; then
    id postgres >/dev/null 2>&1 || { say "no OS user postgres: run infra/prefect/install.sh"; exit 1; }
    runuser -u postgres -- test -x "$STATE" || {
      say "the OS user postgres cannot enter $STATE (or a folder above): choose another PROBEPO_PREFECT_DIR"
      exit 1
    }
  fi
  rm -rf "$DATA"
  mkdir -m 700 "$DATA"
  give_to_owner "$DATA"
  say "initdb $DATA (log $LOG)"
  as_owner "$bin/initdb" -D "$DATA" -E UTF8 --no-locale --auth-local=peer --auth-host=scram-sha-256 \
    >>"$LOG" 2>&1 || { say "initdb failed:"; tail -20 "$LOG" >&2; exit 1; }
  # Loopback only; the socket in the data folder (/var/run/postgresql may not exist, and is not ours).
  printf "listen_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\n" "${DATA//\'/\'\'}" \
    >>"$DATA/postgresql.conf"
}

start() {
  local bin fresh=${PROBEPO_PREFECT_FRESH:-0}
  bin=$(bin_dir)
  mkdir -p "$STATE"
  (umask 077; touch "$LOG")  # a failed statement lands in it: not for every user of the node to read
  give_to_owner "$LOG"
  if [[ ! -s $PWFILE ]]; then
    (umask 077; head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$PWFILE")
  fi
  [[ -s $DATA/PG_VERSION ]] || init_cluster "$bin"
  if ! running; then
    as_owner "$bin/pg_ctl" start -D "$DATA" -l "$LOG" -o "-p $PORT" -w -t 60 >/dev/null 2>&1 || {
      say "PostgreSQL did not start on 127.0.0.1:$PORT; its log ($LOG):"
      tail -20 "$LOG" >&2
      exit 1
    }
    say "PostgreSQL up on 127.0.0.1:$PORT (data $DATA, log $LOG)"
  fi
  # The role (its password from $PWFILE, read here: the postgres user cannot) and the database; the
  # script goes through stdin, so the password shows in no process's arguments.
  local drop=
  if [[ $fresh == 1 ]]; then drop='DROP DATABASE IF EXISTS prefect WITH (FORCE);'; fi
  as_owner "$bin/psql" -X -q -v ON_ERROR_STOP=1 -h "$DATA" -p "$(running_port)" -d postgres >/dev/null <<SQL
SET client_min_messages = warning;
SELECT 'CREATE ROLE probepo LOGIN' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'probepo')
\gexec
ALTER ROLE probepo PASSWORD '$(cat "$PWFILE")';
$drop
SELECT 'CREATE DATABASE prefect OWNER probepo' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'prefect')
\gexec
SQL
  if [[ $fresh == 1 ]]; then say "database prefect emptied (PROBEPO_PREFECT_FRESH=1)"; fi
}

stop() {
  [[ -s $DATA/postmaster.pid ]] || return 0
  local pid children
  pid=$(head -1 "$DATA/postmaster.pid")
  as_owner "$(bin_dir)/pg_ctl" stop -D "$DATA" -m fast -w -t 30 >/dev/null 2>&1 \
    || as_owner "$(bin_dir)/pg_ctl" stop -D "$DATA" -m immediate -w -t 10 >/dev/null 2>&1 || true
  # Still there (or a stale pid file naming another process)? Only a postgres is killed, with its children
  # (each in a session of its own, so not by process group).
  if is_postgres "$pid"; then
    say "PostgreSQL (pid $pid) did not stop: killing it and its children"
    children=$(pgrep -P "$pid" || true)
    # shellcheck disable=SC2086  # one pid a word
    kill -KILL "$pid" $children 2>/dev/null || true
    for _ in $(seq 1 50); do is_postgres "$pid" || break; sleep 0.1; done
  fi
  is_postgres "$pid" || rm -f "$DATA/postmaster.pid"  # a stale one would stop the next start
}

url() {
  [[ -s $PWFILE ]] || { say "no password yet in $PWFILE: run infra/prefect/postgres.sh start"; exit 1; }
  local port=$PORT
  if running; then port=$(running_port); fi
  echo "postgresql+asyncpg://probepo:$(cat "$PWFILE")@127.0.0.1:$port/prefect"
}

case "${1:-}" in
  start | stop | url) "$1" ;;
  *)
    echo "usage: infra/prefect/postgres.sh start | stop | url" >&2
    exit 2
    ;;
esac
