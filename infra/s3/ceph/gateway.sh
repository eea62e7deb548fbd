#!/usr/bin/env bash
# Stop or start the drills' RADOS Gateway alone (client.rgw.drill, on $DRILL_ENDPOINT), the monitor, the OSD
# and the tests' own gateway left running: the objects (in the OSD's memory) stay, as they do when a site
# restarts its gateways for maintenance. What the store-outage drills do to a run
# (tests/slurm/test_store_outage.py), while every other test goes on through the first gateway.
#   bash infra/s3/ceph/gateway.sh stop    # the endpoint refuses connections from now on
#   bash infra/s3/ceph/gateway.sh start   # and answers again (returns once it does, ~1 s)
# Needs the cluster of start.sh (as root). While the gateway is stopped, start.sh would build a cluster
# afresh (its data lost): start the gateway with this script instead.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
source "$HERE/common.sh"
GATEWAY=client.rgw.drill:radosgw

case ${1:-} in
  stop | start) ;;
  *)
    echo "usage: $0 stop|start" >&2
    exit 2
    ;;
esac
if [[ ! -s $STATE/env.sh ]] || ! live_pid mon.a:ceph-mon >/dev/null || ! live_pid osd.0:ceph-osd >/dev/null; then
  log "no cluster of start.sh runs in $STATE: start one first (bash infra/s3/ceph/start.sh)"
  exit 1
fi
exec 9>"$STATE/.lock"
flock 9
if [[ $1 == stop ]]; then
  stop_daemon "$GATEWAY"
elif ! live_pid "$GATEWAY" >/dev/null; then
  log "starting the RADOS Gateway"
  start_gateway client.rgw.drill "$DRILL_ENDPOINT"
fi
