#!/usr/bin/env bash
# Install the Debian packages of a single-node Ceph 16.2 (Pacific) with its S3 gateway: a monitor, an OSD
# daemon, the RADOS Gateway and the `ceph`/`rados` clients, and openssl (the gateway's HTTPS certificate).
# No manager: start.sh runs without one (see README.md). Idempotent: a no-op (well under a second) when everything is already installed.
set -euo pipefail
# shellcheck source=../../apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../apt.sh"
apt_install "s3/ceph/install.sh" ceph-mon ceph-osd radosgw ceph-common openssl
