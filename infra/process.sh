# shellcheck shell=bash
# Sourced by the scripts of infra/ (not run).

# live PID: the process exists and is no zombie. Daemons are reparented to PID 1, which may reap a dead
# one seconds late, and kill -0 succeeds on zombies.
live() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != Z ]]
}

# pid_of PIDFILE PROGRAM: prints the pid the file names if it is a live process of PROGRAM (its
# /proc/PID/comm, which the kernel cuts to 15 characters): a stale pid file whose pid was reused is not.
pid_of() {
  local pid comm
  [[ -r $1 ]] || return 1
  pid=$(tr -dc '0-9' <"$1")
  [[ -n $pid ]] || return 1
  comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
  [[ $comm == "${2:0:15}" ]] || return 1
  live "$pid" || return 1
  echo "$pid"
}
