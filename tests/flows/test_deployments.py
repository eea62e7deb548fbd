"""prefect.yaml's deployments on the real server and process worker of infra/prefect: a train run created
through the API as the UI's Run button does, run by the worker to the same bits as the plain driver, and
parameters that break the schema refused by the API before any flow run exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from uuid import UUID

import pytest
import yaml

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


def test_probepo_launch_creates_the_run_the_worker_runs_and_names_an_unreachable_server(
    deployments, warm_store, tmp_path
):
    preset = tmp_path / "launch.yaml"
    preset.write_text(
        yaml.safe_dump(tiny_config(num_updates=1, store=warm_store.url).model_dump(mode="json"))
    )
    command = [sys.executable, "-m", "probepo.cli", "launch", str(preset), "--run-id", "launched"]
    launched = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert launched.returncode == 0, launched.stderr
    flow_run_id = UUID(re.search(r"\(([0-9a-f-]{36})\)", launched.stdout).group(1))
    assert "/runs/flow-run/" in launched.stdout
    assert _wait_for_end(flow_run_id).state.is_completed()
    assert warm_store.marker("launched", 1, "checkpoint") is not None
    env = {**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api"}
    refused = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode == 2
    assert "PREFECT_API_URL=http://127.0.0.1:9/api does not answer" in refused.stderr


def test_parameters_that_break_the_schema_are_refused_by_the_api(deployments, warm_store):
    from prefect import get_client

    data = tiny_config(store=warm_store.url).model_dump(mode="json")
    data["algo"]["kappa"] = -1.0  # ge=0 in the schema
    with get_client(sync_client=True) as client, pytest.raises(Exception, match=r"409|kappa"):
        client.create_flow_run_from_deployment(
            deployments["train"].id, parameters={"config": data, "run_id": "deployed-bad"}
        )
    assert "deployed-bad" not in warm_store.runs()


def test_cancelling_a_run_ends_its_stage_jobs_and_a_resume_completes_it(
    deployments, warm_store, profile_path, drill_baseline
):
    from prefect import get_client
    from prefect.states import Cancelling

    from flows.train import resume as resume_flow
    from tests.slurm.conftest import drill_config

    config = drill_config(store=warm_store.url)
    parameters = {
        "config": config.model_dump(mode="json"),
        "run_id": "cancelled",
        "executor": "slurm",
        "profile": str(profile_path),
    }
    with get_client(sync_client=True) as client:
        created = client.create_flow_run_from_deployment(deployments["train"].id, parameters=parameters)
        running = _wait_until(lambda: [j for j in _jobs("cancelled", warm_store) if j["state"] == "RUNNING"])
        client.set_flow_run_state(created.id, Cancelling(), force=True)  # what the UI's Cancel does
    job_ids = {str(job["job_id"]) for job in _jobs("cancelled", warm_store)}
    assert running and job_ids
    _wait_until(lambda: not job_ids & _in_squeue(), timeout_s=30)  # every stage job gone within 30 s
    run = _wait_for_end(created.id, timeout_s=120)
    assert run.state.is_cancelled(), run.state
    [cancellation] = warm_store.cancellations("cancelled")
    assert set(cancellation["jobs"]) <= job_ids and str(created.id) in cancellation["by"]
    assert not [j for j in _jobs("cancelled", warm_store) if j["outcome"] == "open"]
    listed = subprocess.run(
        [sys.executable, "-m", "probepo.cli", "store", "ls", "cancelled", "--store", warm_store.url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert f"by Prefect flow run {created.id}" in listed.stdout, listed.stdout + listed.stderr
    state = resume_flow("cancelled", store=warm_store.url, executor="slurm", profile=str(profile_path),
                        return_state=True)  # fmt: skip
    assert state.is_completed(), state.message
    final = warm_store.read_stage("cancelled", 1, "checkpoint")
    assert {name: final[name] for name in FILES} == drill_baseline


def _jobs(run_id: str, store) -> list[dict]:
    return store.jobs(run_id) if run_id in store.runs() else []


def _in_squeue() -> set[str]:
    listed = subprocess.run(
        ["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30, check=True
    )
    return set(listed.stdout.split())


def _wait_until(condition, timeout_s: float = 300):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout_s} s")
