"""The flows tests' fixtures: prefect.yaml deployed once per session, and the SLURM cluster's (shared with
tests/slurm)."""

import os
import subprocess
from pathlib import Path

import pytest

from tests.slurm.conftest import drill_baseline, profile_path, slurm_cluster

__all__ = ["deployments", "drill_baseline", "profile_path", "slurm_cluster"]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def deployments() -> dict[str, object]:
    """prefect.yaml deployed by infra/prefect/deploy.sh, as a user deploys it; the deployments by name."""
    from prefect import get_client

    env = {**os.environ, "PROBEPO_ROOT": str(ROOT)}
    done = subprocess.run(["bash", str(ROOT / "infra" / "prefect" / "deploy.sh")],
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    names = ("train", "resume", "evaluate", "nightly-eval", "demo")
    with get_client(sync_client=True) as client:
        return {name: client.read_deployment_by_name(f"{name}/{name}") for name in names}
