"""prefect.yaml's deployments on the real server and process worker of infra/prefect: a train run created
through the API as the UI's Run button does, run by the worker to the same bits as the plain driver, and
parameters that break the schema refused by the API before any flow run exists."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from probepo.pipeline import train
from tests.pipeline.conftest import tiny_config

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        not os.environ.get("PREFECT_API_URL"),
        reason="needs the Prefect server and worker of infra/prefect (scripts/test starts them)",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
FILES = ("model.safetensors", "optimizer.safetensors", "trainer.json")


@pytest.fixture(scope="module")
def deployments() -> dict[str, object]:
    """`prefect deploy --all` of prefect.yaml, as a user runs it; the deployments by name."""
    from prefect import get_client

    env = {**os.environ, "PROBEPO_ROOT": str(ROOT)}
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "prefect"), "deploy", "--all", "--no-prompt"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    with get_client(sync_client=True) as client:
        return {name: client.read_deployment_by_name(f"{name}/{name}") for name in ("train", "resume")}


def _wait_for_end(flow_run_id, timeout_s: float = 600):
    from prefect import get_client

    with get_client(sync_client=True) as client:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            run = client.read_flow_run(flow_run_id)
            if run.state is not None and run.state.is_final():
                return run
            time.sleep(1)
    raise AssertionError(
        f"flow run {flow_run_id} did not end within {timeout_s} s (worker log: /tmp/probepo-prefect)"
    )


def test_a_train_run_created_through_the_api_runs_on_the_worker_to_the_drivers_bits(deployments, warm_store):
    from prefect import get_client

    config = tiny_config(num_updates=1, store=warm_store.url)
    with get_client(sync_client=True) as client:
        created = client.create_flow_run_from_deployment(
            deployments["train"].id,
            parameters={"config": config.model_dump(mode="json"), "run_id": "deployed"},
        )
    run = _wait_for_end(created.id)
    assert run.state.is_completed(), run.state.message
    assert run.name == "train deployed"
    train(config, "deployed-reference", store=warm_store)
    final, reference = (warm_store.read_stage(r, 1, "checkpoint") for r in ("deployed", "deployed-reference"))
    assert {name: final[name] for name in FILES} == {name: reference[name] for name in FILES}


def test_parameters_that_break_the_schema_are_refused_by_the_api(deployments, warm_store):
    from prefect import get_client

    data = tiny_config(store=warm_store.url).model_dump(mode="json")
    data["algo"]["kappa"] = -1.0  # ge=0 in the schema
    with get_client(sync_client=True) as client, pytest.raises(Exception, match=r"409|kappa"):
        client.create_flow_run_from_deployment(
            deployments["train"].id, parameters={"config": data, "run_id": "deployed-bad"}
        )
    assert "deployed-bad" not in warm_store.runs()
