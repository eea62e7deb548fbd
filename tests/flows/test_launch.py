"""Launching from the deployments deploy.sh makes for a site, on the real server (PostgreSQL), worker, SLURM
cluster and store: each deployment's untouched defaults run or are refused at once in one line; a
cross-field error is refused before any job; the 7B recipe's deployment, on the test site's CPU profile,
is warned of; a resident run's progress and metrics advance while its one job runs, its flow's log says
which warm-up the job starts from, its TensorBoard events and log are where the docs say; five runs
created back to back all complete."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest

from probepo.checks.findings import Refused
from tests.flows import NEEDS_PREFECT
from tests.flows.conftest import TESTBED
from tests.flows.test_deployments import _flow_run_logs, _wait_for_end, _wait_until
from tests.slurm.conftest import drill_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600), NEEDS_PREFECT]

RUNS_UNTOUCHED = {"cpu-demo", "cpu-pointer", TESTBED}
"""The train deployments whose defaults pass every check here; the study's recipes name hub models this
machine has not cached, and are refused (cpu-smollm2 runs where its PyPI package is installed)."""


def _artifact(key: str):
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_latest_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )
    return found[0] if found else None


def test_every_deployment_runs_as_it_stands_or_is_refused_at_once_in_one_line(deployments, site, warm_store):
    from prefect import get_client

    from flows.evaluate import nightly_eval
    from slurm.check import check_launch, launchable

    for name, deployment in deployments.items():
        schema = deployment.parameter_openapi_schema["properties"]
        assert all(field.get("description") for field in schema.values()), (name, schema)
        if not name.startswith("train/"):
            continue
        parameters = deployment.parameters
        needs = "resident" if parameters["config"]["checkpoint_every"] > 1 else "slurm"  # else the site's
        assert parameters["config"]["store"] == warm_store.url and parameters["executor"] == needs
        try:
            launchable(**parameters)
        except Refused as refusal:
            assert name.removeprefix("train/") not in RUNS_UNTOUCHED, refusal.problems
            assert all("\n" not in problem for problem in refusal.problems)
            assert "model.pretrained" in str(refusal) or "SmolLM2" in str(refusal)
        else:
            assert name.removeprefix("train/") in RUNS_UNTOUCHED | {"cpu-smollm2"}

    recipe = deployments["train/deepseekmath-7b-sft"]
    assert recipe.parameters["config"]["num_updates"] == 1000  # the form opens on the recipe's values
    # it opens on the site's only profile, the CPU test cluster's: `probepo check`'s checks warn
    warnings = check_launch(**recipe.parameters).findings.warnings
    assert any(
        line.startswith("GPUs: the profile gives none to the jobs that load the model") for line in warnings
    )
    with get_client(sync_client=True) as client:
        untouched = client.create_flow_run_from_deployment(recipe.id)  # Quick run
        for needs_a_run_id in ("resume/resume", "evaluate/evaluate"):  # their forms refuse at once
            with pytest.raises(Exception, match="run_id"):
                client.create_flow_run_from_deployment(deployments[needs_a_run_id].id)
    run = _wait_for_end(untouched.id, timeout_s=120)
    assert run.state.is_failed() and "\n" not in run.state.message
    assert run.state.message.startswith("refused: model.pretrained = deepseek-ai/deepseek-math-7b-instruct")
    run_id = f"deepseekmath-7b-sft-{str(run.id)[:8]}"  # an empty run id: the deployment's name and the run's
    assert run.name == f"train {run_id}"
    refusal = _artifact(f"run-{run_id}-refused")
    assert refusal is not None and "Nothing was submitted" in refusal.data

    nightly = deployments["nightly-eval/nightly-eval"].parameters
    assert (nightly["store"], nightly["profile"]) == (
        warm_store.url,
        str((site.parent / "profile.yaml").resolve()),
    )
    state = nightly_eval(store=None, return_state=True)  # a site without a store: refused, saying what to set
    assert state.is_failed() and state.message == (
        "refused: no store given: set the store parameter (or the site's store); executor slurm needs a"
        " profile: set the profile parameter (or the site's)"
    )


def test_a_cross_field_error_is_refused_before_any_job_in_one_line(deployments, warm_store):
    from prefect import get_client

    data = drill_config(store=warm_store.url).model_dump(mode="json")
    data["algo"]["rescue_suffix"] = "\\boxed{"  # the modchain task cannot tokenize it
    with get_client(sync_client=True) as client:
        created = client.create_flow_run_from_deployment(
            deployments[f"train/{TESTBED}"].id, parameters={"config": data, "run_id": "cross-field"}
        )
    run = _wait_for_end(created.id, timeout_s=120)
    assert run.state.is_failed() and "\n" not in run.state.message
    assert run.state.message.startswith(
        "refused: config: algo.rescue_suffix = '\\\\boxed{' cannot be tokenized"
    )
    assert "cross-field" not in warm_store.runs()  # nothing committed, nothing submitted
    logs = _flow_run_logs(
        created.id, until=lambda records: any("Finished in state" in r.message for r in records)
    )
    assert [r.message for r in logs if r.level >= logging.ERROR] == [run.state.message]  # the line, once
    assert not [r for r in logs if "Traceback" in r.message]


def test_a_resident_run_shows_progress_and_metrics_while_its_job_runs(
    deployments, site, warm_store, tmp_path
):
    from prefect import get_client

    run_id = "live-resident"
    config = drill_config(store=warm_store.url, num_updates=2, checkpoint_every=2)
    paused, release = tmp_path / "paused", tmp_path / "release"
    # the job holds inside update 1 (update 0 committed) until `release` exists
    hold = {"PROBEPO_PAUSE_AT": "1:sample:before-commit", "PROBEPO_PAUSE_MARK": str(paused),
            "PROBEPO_PAUSE_RELEASE": str(release)}  # fmt: skip
    parameters = {"config": config.model_dump(mode="json"), "run_id": run_id, "executor": "resident"}
    with get_client(sync_client=True) as client:
        created = client.create_flow_run_from_deployment(
            deployments[f"train/{TESTBED}"].id, parameters=parameters, job_variables={"env": hold}
        )
    _wait_until(paused.exists, timeout_s=300)
    progress = _wait_until(
        lambda: (a := _artifact(f"{run_id}-progress")) and a.data == 50.0 and a, timeout_s=60
    )
    metrics = _wait_until(lambda: _artifact(f"{run_id}-metrics"), timeout_s=30)
    assert progress.data == 50.0 and [row["update"] for row in _rows(metrics)] == [0]
    release.touch()
    assert _wait_for_end(created.id).state.is_completed()
    assert _artifact(f"{run_id}-progress").data == 100.0
    assert [row["update"] for row in _rows(_artifact(f"{run_id}-metrics"))] == [0, 1, 2]

    said = _flow_run_logs(created.id, until=lambda records: any("warm-up: " in r.message for r in records))
    assert any(r.message.endswith("(reused: the driver job starts from it)") for r in said), (
        said
    )  # not the job's
    jobs = site.parent / "jobs" / run_id
    assert list((jobs / "tensorboard").glob("events.out.tfevents.*"))  # written by the job itself
    logs = subprocess.run([sys.executable, "-m", "probepo.cli", "logs", run_id, "--store", warm_store.url],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert logs.returncode == 0, logs.stderr
    assert str(jobs) in logs.stdout and f"run {run_id}" in logs.stdout  # the driver's own lines


def _rows(artifact) -> list[dict]:
    import json

    return json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data


def test_five_runs_created_back_to_back_all_complete(deployments, warm_store):
    from prefect import get_client

    config = drill_config(store=warm_store.url, num_updates=0).model_dump(mode="json")
    started = time.monotonic()
    with get_client(sync_client=True) as client:
        created = [
            client.create_flow_run_from_deployment(
                deployments[f"train/{TESTBED}"].id,
                parameters={"config": config, "run_id": f"burst-{i}", "executor": "inline"},
            )
            for i in range(5)
        ]
    ends = [_wait_for_end(run.id, timeout_s=300) for run in created]
    assert all(run.state.is_completed() for run in ends), [(run.name, run.state.message) for run in ends]
    assert all(warm_store.marker(f"burst-{i}", 0, "evaluate") is not None for i in range(5))
    assert time.monotonic() - started < 300
