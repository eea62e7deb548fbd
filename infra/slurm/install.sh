#!/usr/bin/env bash
# Install the Debian packages of a single-node SLURM 22.05 cluster with accounting, and bubblewrap: the
# container runtime the tests start a stage job's Python in (an execution profile's `python` prefix).
# Idempotent: a no-op (well under a second) when everything is already installed.
set -euo pipefail
# shellcheck source=../apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/../apt.sh"
apt_install "slurm/install.sh" slurmctld slurmd slurm-client slurmdbd munge mariadb-server bubblewrap
