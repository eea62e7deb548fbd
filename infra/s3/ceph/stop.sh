#!/usr/bin/env bash
# Stop the Ceph started by start.sh: the gateway, the OSD and the monitor, by their pid files (SIGTERM, then
# SIGKILL after 10 s: the cluster holds nothing worth saving, every start builds it afresh). Idempotent:
# exits 0 when nothing runs. `--wipe` also deletes the state folder.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
source "$HERE/common.sh"

[[ -d $STATE ]] || exit 0
if [[ ${PROBEPO_CEPH_LOCKED:-0} != 1 ]]; then
  exec 9>"$STATE/.lock"
  flock 9
fi
for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do
  stop_daemon "${DAEMONS[i]}"
done
rm -f "$STATE/env.sh"
if [[ ${1:-} == --wipe ]]; then
  rm -rf "$STATE"
fi
