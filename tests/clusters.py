"""Which SLURM cluster of the box each test module drives. Tests that take a node down, preempt, requeue or
list every job would disturb each other on one cluster, so each group has a cluster of its own
(infra/slurm/clusters/<name>.env; `main` is the two-node cluster the Prefect worker submits to) and the
groups run side by side, each as one xdist unit in order (tests/conftest.py)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INFRA = ROOT / "infra" / "slurm"

GROUPS: tuple[tuple[str, str], ...] = (
    ("tests/slurm/test_qos_preemption.py", "qos"),
    ("tests/slurm/test_store_outage.py", "outage"),
    ("tests/slurm/test_drill.py", "drills"),
    ("tests/slurm/test_resident.py", "drills"),
    ("tests/slurm/test_costs.py", "drills"),
    ("tests/slurm/test_leases.py", "drills"),
    ("tests/slurm/test_nightly.py", "drills"),
    ("tests/slurm/", "jobs"),
    ("tests/deepspeed/test_engine.py", "deepspeed"),
    ("tests/deepspeed/test_resident.py", "deepspeed"),
    ("tests/deepspeed/test_two_nodes.py", "deepspeed"),
    ("tests/flows/", "main"),
)
"""(path prefix, cluster): the first prefix a test's path starts with names its cluster."""
UNCLUSTERED = ("tests/slurm/test_store_outage_local.py",)
"""Modules under a clustered folder that submit no job (a local executor's drill)."""
SLURM_KEYS = ("SLURM_CONF", "PROBEPO_SLURM_DIR", "PROBEPO_SLURM_NODE", "PROBEPO_SLURM_NODES",
              "PROBEPO_SLURM_PREEMPT", "PROBEPO_SLURM_CLUSTER")  # fmt: skip
"""What infra/slurm/start.sh prints: a test's commands and the jobs it submits read these."""


def cluster_of(nodeid: str) -> str | None:
    """The cluster a test (by its node id, a path relative to the repository) drives; None: none."""
    path = nodeid.split("::", 1)[0]
    if path.startswith(UNCLUSTERED):
        return None
    return next((name for prefix, name in GROUPS if path.startswith(prefix)), None)


def settings(name: str) -> dict[str, str]:
    """The start.sh environment of cluster `name` (infra/slurm/clusters/<name>.env; `main`: two nodes)."""
    if name == "main":
        return {"PROBEPO_SLURM_NODES": "2"}
    lines = (INFRA / "clusters" / f"{name}.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


STARTED_HERE: set[str] = set()
"""Clusters this process started (none under .ci/run, which starts them all): stopped at the session's end."""


@functools.cache
def environment(name: str) -> dict[str, str]:
    """Cluster `name`'s client environment (SLURM_CONF, PROBEPO_SLURM_NODE, ...). infra/slurm/start.sh
    prints it when the cluster runs (no root needed) and starts it first where this machine can (root,
    packages installed); the test is skipped where it cannot."""
    overrides = {key: value for key, value in os.environ.items() if not key.startswith("PROBEPO_SLURM_")}
    env = {**overrides, **settings(name)}
    state = Path(env.get("PROBEPO_SLURM_DIR", "/tmp/probepo-slurm"))
    running = (state / "env.sh").exists() and (state / "run" / "slurmctld.pid").exists()
    if not running and (os.geteuid() != 0 or shutil.which("slurmctld") is None):
        pytest.skip(
            f"no SLURM cluster {name}: as root, `bash infra/slurm/install.sh` then `bash scripts/services.sh "
            "start` (or run .ci/run, which does it)"
        )
    start = ["bash", str(INFRA / "start.sh")]
    started = subprocess.run(start, capture_output=True, text=True, timeout=300, env=env)
    assert started.returncode == 0, f"cluster {name} did not start: {started.stderr}"
    if "already running" not in started.stderr:
        STARTED_HERE.add(name)
    exports = (line.removeprefix("export ").split("=", 1) for line in started.stdout.splitlines())
    return {key: value for key, value in exports if key in SLURM_KEYS}


def stop_started_here() -> None:
    """Stop the clusters this process started."""
    for name in sorted(STARTED_HERE):
        subprocess.run(["bash", str(INFRA / "stop.sh")], env={**os.environ, **settings(name)},
                       capture_output=True, timeout=120)  # fmt: skip
    STARTED_HERE.clear()
