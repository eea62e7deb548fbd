"""The real SLURM cluster of infra/slurm/ (munge, MariaDB, slurmdbd, slurmctld, two slurmd): `.ci/run`
starts it before the suite and stops it after; run alone, the session starts it here when this machine can
(root, packages installed) and stops it at the end. Node 1 alone is in the partitions most tests use (low,
high, short), as on a single-node cluster; the two-node tests use `wide`, both nodes."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from probepo.config import ExecutionProfile, StageResources
from probepo.store import ArtifactStore
from tests.pipeline.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra" / "slurm"


def _exports(text: str) -> dict[str, str]:
    pairs = (
        line.removeprefix("export ").split("=", 1) for line in text.splitlines() if line.startswith("export ")
    )
    return {key: value for key, value in pairs}


def _start_cluster(settings: dict[str, str]) -> dict[str, str]:
    """Start a cluster of infra/slurm with `settings` (its environment variables) here, where this machine
    can (root, packages installed); returns its environment (SLURM_CONF, ...)."""
    if os.geteuid() != 0 or shutil.which("slurmctld") is None:
        pytest.skip(
            "no SLURM cluster: as root, `bash infra/slurm/install.sh` then"
            ' `eval "$(bash infra/slurm/start.sh)"` (or run .ci/run, which does it)'
        )
    started = subprocess.run(
        ["bash", str(INFRA / "start.sh")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **settings},
    )
    assert started.returncode == 0, started.stderr
    return _exports(started.stdout)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[dict[str, str]]:
    """The cluster's environment (SLURM_CONF, ...), set in this process for the session."""
    started_here = not os.environ.get("SLURM_CONF")
    if started_here:
        os.environ.update(_start_cluster({"PROBEPO_SLURM_NODES": os.environ.get("PROBEPO_SLURM_NODES", "2")}))
    yield {key: os.environ[key] for key in ("SLURM_CONF", "PROBEPO_SLURM_NODE") if key in os.environ}
    if started_here:
        subprocess.run(["bash", str(INFRA / "stop.sh")], capture_output=True, timeout=120)


QOS_CLUSTER = dict(
    line.split("=", 1)
    for line in (INFRA / "qos-cluster.env").read_text().splitlines()
    if line and not line.startswith("#")
)
"""The second controller's settings: one node, preemption by QOS (scripts/services.sh starts it)."""


@pytest.fixture(scope="session")
def qos_slurm_conf() -> Iterator[str]:
    """The SLURM_CONF of the cluster that preempts by QOS: the one `.ci/run` started
    (PROBEPO_TEST_QOS_SLURM_CONF), else one started here for the session."""
    given = os.environ.get("PROBEPO_TEST_QOS_SLURM_CONF")
    if given:
        yield given
        return
    yield _start_cluster(QOS_CLUSTER)["SLURM_CONF"]
    subprocess.run(
        ["bash", str(INFRA / "stop.sh")], env={**os.environ, **QOS_CLUSTER}, capture_output=True, timeout=120
    )


@pytest.fixture
def qos_cluster(qos_slurm_conf: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """This test's SLURM commands (and the drivers it starts) go to the QOS cluster; returns its node."""
    monkeypatch.setenv("SLURM_CONF", qos_slurm_conf)
    monkeypatch.setenv("PROBEPO_SLURM_NODE", QOS_CLUSTER["PROBEPO_SLURM_NODE"])
    return QOS_CLUSTER["PROBEPO_SLURM_NODE"]


@pytest.fixture
def profile_path(tmp_path: Path, slurm_cluster) -> Path:
    """An execution profile for the test cluster: every stage in the preemptable `low` partition, a fresh
    job folder, quick polls at a fixed interval (backing off would only delay seeing a job end)."""
    profile = ExecutionProfile(
        job_folder=str(tmp_path / "jobs"),
        poll_s=0.3,
        poll_max_s=0.3,
        defaults=StageResources(partition="low", time_min=15, signal_grace_s=30),
    )
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile.model_dump(mode="json")))
    return path


def drill_config(**fields):
    """One update of the tiny recipe, evaluated before and after only (9 stage jobs)."""
    fields = {"num_updates": 1, "eval": {**tiny_config().eval.model_dump(), "every": 10}, **fields}
    return tiny_config("probepo", **fields)


@pytest.fixture(scope="session")
def drill_baseline(warm_store: ArtifactStore) -> dict[str, bytes]:
    """The drill recipe's final checkpoint, trained inline."""
    from probepo.pipeline import train

    train(drill_config(), "drill-inline", store=warm_store)
    final = warm_store.read_stage("drill-inline", 1, "checkpoint")
    return {name: final[name] for name in ("model.safetensors", "optimizer.safetensors", "trainer.json")}
