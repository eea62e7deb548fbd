# Sourced by the install scripts of infra/ (not run): apt_install WHAT PACKAGE... installs the Debian
# packages that are missing. Idempotent: a no-op (well under a second) when all are installed.

apt_install() {
  local what=$1 p missing=() created_policy=0 policy=/usr/sbin/policy-rc.d
  shift
  for p in "$@"; do
    # dpkg-query is fast and exact: "install ok installed" only for fully configured packages.
    if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" != "install ok installed" ]]; then
      missing+=("$p")
    fi
  done
  if [[ ${#missing[@]} -eq 0 ]]; then
    echo "$what: all packages already installed" >&2
    return 0
  fi
  if [[ $(id -u) -ne 0 ]]; then
    echo "$what: missing ${missing[*]}; run as root (or via sudo) to install" >&2
    return 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  echo "$what: installing ${missing[*]}" >&2
  # No systemd here: policy-rc.d exit 101 stops the maintainer scripts from trying to start
  # daemons (mariadb's postinst otherwise tries, and our start scripts run their own instances anyway).
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    created_policy=1
  fi
  # Update the package lists only when installing: a fresh CI image has none.
  local status=0
  { apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends "$@" >&2; } || status=$?
  if [[ $created_policy -eq 1 ]]; then rm -f "$policy"; fi
  [[ $status -eq 0 ]] && echo "$what: done" >&2
  return $status
}
