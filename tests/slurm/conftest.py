"""The real SLURM clusters of infra/slurm/ (munge, MariaDB, slurmdbd, slurmctld, one or two slurmd each): a
group of these tests drives a cluster of its own (tests/clusters.py). `.ci/run` starts them before the suite
and stops them after; run alone, the session starts one here when this machine can (root, packages
installed) and stops it at the end. Node 1 alone is in the partitions most tests use (low, high, short), as
on a single-node cluster; the two-node tests use `wide`, both nodes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from probepo.config import ExecutionProfile, StageResources
from probepo.store import ArtifactStore
from tests import clusters
from tests.pipeline.conftest import tiny_config


@pytest.fixture(scope="module")
def slurm_cluster() -> dict[str, str]:
    """The environment of the cluster this test's group drives (SLURM_CONF, ...): tests/conftest.py set it in
    this process before the test's fixtures, from tests/clusters.py; skipped where no cluster can run."""
    if not os.environ.get("SLURM_CONF"):
        pytest.skip(
            "no SLURM cluster: as root, `bash infra/slurm/install.sh` then `bash scripts/services.sh start`"
            " (or run .ci/run, which does it)"
        )
    return {key: os.environ[key] for key in clusters.SLURM_KEYS if key in os.environ}


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
    from probepo.run.pipeline import train

    train(drill_config(), "drill-inline", store=warm_store)
    final = warm_store.read_stage("drill-inline", 1, "checkpoint")
    return {name: final[name] for name in ("model.safetensors", "optimizer.safetensors", "trainer.json")}
