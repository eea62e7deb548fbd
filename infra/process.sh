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
