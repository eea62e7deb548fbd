"""The flows tests' fixtures: the deployments deploy.sh makes (one train deployment per preset) on the
real server, for a test site — the warm store, the SLURM executor on the test cluster, and a tiny testbed
preset of its own — and the SLURM cluster's fixtures (shared with tests/slurm)."""

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from probepo.config import ExecutionProfile, StageResources
from tests.slurm.conftest import drill_baseline, drill_config, profile_path, slurm_cluster

__all__ = ["deployments", "drill_baseline", "profile_path", "site", "slurm_cluster"]

ROOT = Path(__file__).resolve().parents[2]
TESTBED = "ui-testbed"
"""The test site's own preset: the tiny testbed recipe, one update, evaluated before and after."""


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory, warm_store) -> Path:
    """A site file: the warm store, every stage a job of the test cluster (the main one, the worker's), and
    a recipe folder holding the ui-testbed preset."""
    folder = tmp_path_factory.mktemp("site")
    profile = ExecutionProfile(
        job_folder=str(folder / "jobs"),
        poll_s=0.3,
        poll_max_s=0.3,
        defaults=StageResources(partition="low", time_min=15),
    )
    (folder / "profile.yaml").write_text(yaml.safe_dump(profile.model_dump(mode="json")))
    (folder / "recipes").mkdir()
    recipe = drill_config(store=warm_store.url).model_dump(mode="json", exclude={"store"})
    (folder / "recipes" / f"{TESTBED}.yaml").write_text(
        "# The tiny testbed: 4 prompts x 4 responses of 3-step mod-3 chains.\n" + yaml.safe_dump(recipe)
    )
    settings = {"store": warm_store.url, "executor": "slurm", "profile": "profile.yaml"}
    settings["recipes"] = ["recipes"]
    (folder / "site.yaml").write_text(yaml.safe_dump(settings))
    return folder / "site.yaml"


@pytest.fixture(scope="session")
def deployments(site: Path) -> dict[str, object]:
    """The deployments infra/prefect/deploy.sh makes for the test site, as a user deploys them, by
    `flow/deployment` name."""
    from prefect import get_client

    env = {**os.environ, "PROBEPO_ROOT": str(ROOT), "PROBEPO_SITE": str(site)}
    done = subprocess.run(["bash", str(ROOT / "infra" / "prefect" / "deploy.sh")],
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    presets = [path.stem for path in (ROOT / "configs").glob("*.yaml")] + [TESTBED]
    names = [f"train/{name}" for name in presets]
    names += ["resume/resume", "evaluate/evaluate", "nightly-eval/nightly-eval", "demo/demo"]
    with get_client(sync_client=True) as client:
        return {name: client.read_deployment_by_name(name) for name in names}
