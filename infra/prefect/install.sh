#!/usr/bin/env bash
# Install Debian's PostgreSQL (15), the Prefect server's database (infra/prefect/postgres.sh runs a cluster
# of its own from its binaries; Debian's default cluster is left alone, never started).
# Idempotent: a no-op when it is installed. Installing needs root (apt-get).
set -euo pipefail
# shellcheck source=../apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/../apt.sh"
apt_install "prefect/install.sh" postgresql
