#!/usr/bin/env bash
# The services the test suite needs, all of them real: a two-node SLURM 22.05 cluster with accounting
# (infra/slurm; node 1 alone in its partitions low, high and short, both nodes in wide), the Prefect worker's;
# one more cluster of its own controller per group of tests that would disturb each other's jobs
# (infra/slurm/clusters/*.env: DeepSpeed jobs, drills, job tests, store outages, and one that preempts by
# QOS, as many sites do), so that the groups run side by side (tests/clusters.py); two S3 endpoints (moto,
# infra/s3; Ceph's RADOS Gateway, infra/s3/ceph) and a Prefect server (infra/prefect). `start` installs what is missing (idempotent) and writes the environment a shell
# needs to .services.env; `stop` stops every one of them and leaves no process. `start --fresh` (the test
# command's) first stops whatever runs (perhaps started from another checkout, or left by a killed session)
# and gives Prefect an empty database, so that no flow run scheduled earlier is picked up by the new worker.
set -euo pipefail
cd "$(dirname "$0")/.."
# Runs "$@" for each cluster of infra/slurm/clusters/ (own state folder, ports and nodes), all at once.
each_test_cluster() {
  local settings pids=()
  for settings in infra/slurm/clusters/*.env; do
    # shellcheck disable=SC2046  # one NAME=value a word
    env $(grep -v '^#' "$settings") "$@" >/dev/null &
    pids+=($!)
  done
  local pid failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  return $failed
}
case "${1:-}" in
  start)
    if [[ ${2:-} == --fresh ]]; then
      bash scripts/services.sh stop
      export PROBEPO_PREFECT_FRESH=1
    fi
    bash infra/slurm/install.sh >&2
    bash infra/s3/ceph/install.sh >&2
    bash infra/browser/install.sh  # not a service: the UI tests' browser
    bash infra/prefect/install.sh  # PostgreSQL, the Prefect server's database
    # Two slurmd: the multi-node tests need a second node, the others use node 1's partitions as they would
    # a single-node cluster's (tests/slurm/conftest.py).
    export PROBEPO_SLURM_NODES=${PROBEPO_SLURM_NODES:-2}
    : >.services.env
    chmod 600 .services.env  # it holds the Prefect API's password
    for service in slurm s3 s3/ceph prefect; do  # each starts with the environment of those before it
      bash "infra/$service/start.sh" >>.services.env
      set -a
      # shellcheck disable=SC1091
      source .services.env
      set +a
    done
    each_test_cluster bash infra/slurm/start.sh
    ;;
  stop)
    bash infra/prefect/stop.sh || true
    bash infra/s3/ceph/stop.sh || true
    bash infra/s3/stop.sh || true
    bash infra/slurm/stop.sh >&2 || true
    each_test_cluster bash infra/slurm/stop.sh || true
    rm -f .services.env
    ;;
  *)
    echo "usage: scripts/services.sh start [--fresh] | stop" >&2
    exit 2
    ;;
esac
