#!/usr/bin/env bash
# Install the Debian packages of a single-node SLURM 22.05 cluster with accounting.
# Idempotent: a no-op (well under a second) when everything is already installed.
set -euo pipefail

PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server)

missing=()
for p in "${PACKAGES[@]}"; do
  # dpkg-query is fast and exact: "install ok installed" only for fully configured packages.
  if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" != "install ok installed" ]]; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install.sh: all SLURM packages already installed" >&2
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "install.sh: missing ${missing[*]}; run as root (or via sudo) to install" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
echo "install.sh: installing ${missing[*]}" >&2
# No systemd here: policy-rc.d exit 101 stops the maintainer scripts from trying to start
# daemons (mariadb's postinst otherwise tries, and start.sh runs its own instances anyway).
policy=/usr/sbin/policy-rc.d
created_policy=0
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod +x "$policy"
  created_policy=1
fi
trap 'if [[ $created_policy -eq 1 ]]; then rm -f "$policy"; fi' EXIT

# Update the package lists only when installing: a fresh CI image has none.
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >&2
echo "install.sh: done" >&2
