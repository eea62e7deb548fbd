"""prefect.yaml's deployments on the real server and process worker of infra/prefect: a train run created
through the API as the UI's Run button does, run by the worker to the same bits as the plain driver;
parameters that break the schema refused by the API before any flow run exists; a flow-run process killed
mid-stage, then the resume deployment re-attaching to its job; cancelling; the nightly schedule and each
nightly run's dated name; and the API's basic authentication (every call of these tests, and of the
worker, carries the password)."""

from __future__ import annotations

import base64
import logging
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from uuid import UUID

import pytest
import yaml

from probepo.run.pipeline import train
from tests.flows import NEEDS_PREFECT
from tests.pipeline.conftest import tiny_config
from tests.slurm.drill import accounted_states

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(900),
    NEEDS_PREFECT,
]

ROOT = Path(__file__).resolve().parents[2]
FILES = ("model.safetensors", "optimizer.safetensors", "trainer.json")
RUNNERS_LINE = "Flow run was cancelled successfully."
"""The state message Prefect's runner sets on a cancelled flow run once its process has exited."""


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


def _cancelled_for_good(flow_run_id, timeout_s: float = 120):
    """The flow run once Prefect's runner has set its Cancelled state and line, after the flow's own (its
    process exited), and something has been set over it since: the flow's line again (flows/cancelled.py)."""
    from prefect import get_client

    messages: list = []
    with get_client(sync_client=True) as client:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            messages = [state.message for state in client.read_flow_run_states(flow_run_id)]
            if RUNNERS_LINE in messages[:-1]:
                return client.read_flow_run(flow_run_id)
            time.sleep(1)
    raise AssertionError(
        f"flow run {flow_run_id}: no state after the runner's within {timeout_s} s: {messages}"
    )


def test_a_train_run_created_through_the_api_runs_on_the_worker_to_the_drivers_bits(deployments, warm_store):
    from prefect import get_client

    config = tiny_config(num_updates=1, store=warm_store.url)
    with get_client(sync_client=True) as client:
        created = client.create_flow_run_from_deployment(
            deployments["train/ui-testbed"].id,
            parameters={"config": config.model_dump(mode="json"), "run_id": "deployed", "executor": "inline"},
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
    command = [sys.executable, "-m", "probepo.cli", "launch", str(preset), "--run-id", "launched",
               "--deployment", "train/ui-testbed"]  # fmt: skip
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
            deployments["train/ui-testbed"].id, parameters={"config": data, "run_id": "deployed-bad"}
        )
    assert "deployed-bad" not in warm_store.runs()


def test_cancelling_a_run_ends_its_stage_jobs_and_a_resume_completes_it(
    deployments, warm_store, profile_path, drill_baseline
):
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.states import Cancelling

    from flows.train import resume as resume_flow
    from probepo.stages.warmup import warmup_run_id
    from tests.slurm.conftest import drill_config

    config = drill_config(store=warm_store.url)
    parameters = {
        "config": config.model_dump(mode="json"),
        "run_id": "cancelled",
        "executor": "slurm",
        "profile": str(profile_path),
    }
    with get_client(sync_client=True) as client:
        created = client.create_flow_run_from_deployment(
            deployments["train/ui-testbed"].id, parameters=parameters
        )
        running = _wait_until(lambda: [j for j in _jobs("cancelled", warm_store) if j["state"] == "RUNNING"])
        client.set_flow_run_state(created.id, Cancelling(), force=True)  # what the UI's Cancel does
    job_ids = {str(job["job_id"]) for job in _jobs("cancelled", warm_store)}
    assert running and job_ids
    _wait_until(lambda: not job_ids & _in_squeue(), timeout_s=30)  # every stage job gone within 30 s
    run = _wait_for_end(created.id, timeout_s=120)
    assert run.state.is_cancelled(), run.state
    [cancellation] = warm_store.cancellations("cancelled")
    ended = f"run cancelled cancelled; jobs ended: {', '.join(cancellation['jobs'])}"
    # Prefect logs a task run that ends Cancelled (the stage's job, cancelled with the run) at ERROR: the
    # flow's log says so after our line
    explained = "its level for every end but Completed; nothing failed"
    logs = _flow_run_logs(created.id, until=lambda records: any(explained in r.message for r in records))
    assert any(ended in record.message for record in logs), [record.message for record in logs]
    assert any(explained in record.message for record in logs), [record.message for record in logs]
    errors = [
        r
        for r in logs
        if r.level >= logging.ERROR and not r.message.startswith("Finished in state Cancelled")
    ]
    assert not errors and not [r for r in logs if "Traceback" in r.message], logs
    # the driver may have submitted the next stage's job before the cancellation reached it: ended too
    recorded = {str(job["job_id"]) for job in _jobs("cancelled", warm_store)}
    assert set(cancellation["jobs"]) <= recorded and not recorded & _in_squeue()
    assert str(created.id) in cancellation["by"]
    assert not [j for j in _jobs("cancelled", warm_store) if j["outcome"] == "open"]
    assert warm_store.cancellations(warmup_run_id(config)) == []  # its warm-up, made long ago, left alone
    listed = subprocess.run(
        [sys.executable, "-m", "probepo.cli", "store", "ls", "cancelled", "--store", warm_store.url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert f"by Prefect flow run {created.id}" in listed.stdout, listed.stdout + listed.stderr
    state = resume_flow("cancelled", store=warm_store.url, executor="slurm", profile=str(profile_path),
                        return_state=True)  # fmt: skip
    assert state.is_completed(), state.message
    with get_client(sync_client=True) as client:
        [shown] = client.read_latest_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["cancelled-resume"]))
        )
    assert "resumed" in shown.data and "at update 0 of 1" in shown.data
    final = warm_store.read_stage("cancelled", 1, "checkpoint")
    assert {name: final[name] for name in FILES} == drill_baseline


def test_a_cancel_during_the_warm_up_ends_its_job_and_every_task_run_shows_cancelled(
    deployments, warm_store, profile_path
):
    """A recipe whose warm-up is not made yet: cancelled while the warm-up's job runs, that job is ended
    (sacct: CANCELLED), the cancellation is recorded in the run and in the warm-up's, every task run ends
    Cancelled with its job's id (the warm-up's named as such), and the flow run's final state message is
    ours, set again after the line Prefect's runner sets once the flow's process has exited."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.states import Cancelling

    from flows.train import cancel_line
    from probepo.stages.warmup import warmup_run_id
    from tests.slurm.conftest import drill_config

    base = drill_config(store=warm_store.url)
    # a warm-up of its own that runs long (a target it will not reach soon): the cancel finds its job running
    slow = {"seed": 4242, "accuracy_low": 0.98, "accuracy_high": 0.99, "max_steps": 4000}
    config = drill_config(store=warm_store.url, warmup={**base.warmup.model_dump(), **slow})
    warming = warmup_run_id(config)
    parameters = {"config": config.model_dump(mode="json"), "run_id": "cancelled-warm-up",
                  "executor": "slurm", "profile": str(profile_path)}  # fmt: skip
    with get_client(sync_client=True) as client:
        created = client.create_flow_run_from_deployment(
            deployments["train/ui-testbed"].id, parameters=parameters
        )
        [job] = _wait_until(lambda: [j for j in _jobs(warming, warm_store) if j["state"] == "RUNNING"])
        client.set_flow_run_state(created.id, Cancelling(), force=True)  # what the UI's Cancel does
    run = _cancelled_for_good(created.id)  # the runner's line, then ours again over it
    assert run.state.is_cancelled(), run.state
    job_id = str(job["job_id"])
    assert run.state.message == cancel_line("cancelled-warm-up", warming, [job_id]), run.state.message
    assert run.state.message.startswith(f"run cancelled-warm-up cancelled with the warm-up {warming} it was")
    ended = accounted_states(job_id, timeout_s=300)[-1]
    assert ended.startswith("CANCELLED"), ended
    assert [c["jobs"] for c in warm_store.cancellations(warming)] == [[job_id]]
    assert [c["jobs"] for c in warm_store.cancellations("cancelled-warm-up")] == [[job_id]]
    assert not warm_store.committed(warming, 0, "warmup")
    with get_client(sync_client=True) as client:
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[created.id])))
    assert [(t.name, t.state.type.value) for t in tasks] == [(f"warm-up · job {job_id}", "CANCELLED")]
    assert tasks[0].state.message == f"job {job_id} cancelled with the run"


def _flow_run_logs(flow_run_id, until=lambda records: True, timeout_s: float = 30) -> list:
    """The flow run's log records (with its task runs'), once `until` holds of them (logs arrive late)."""
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    records: list = []
    of_the_run = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
    with get_client(sync_client=True) as client:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            records = client.read_logs(log_filter=of_the_run)
            if until(records):
                break
            time.sleep(0.5)
    return records


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


def test_a_killed_flow_run_is_resumed_by_the_resume_deployment_without_submitting_twice(
    deployments, warm_store, profile_path, drill_baseline, tmp_path
):
    from prefect import get_client

    from tests.flows.test_train_flow import _task_run_names
    from tests.slurm.conftest import drill_config

    config = drill_config(store=warm_store.url)
    parameters = {"config": config.model_dump(mode="json"), "run_id": "flow-killed", "executor": "slurm",
                  "profile": str(profile_path)}  # fmt: skip
    paused, release = tmp_path / "paused", tmp_path / "release"
    # The flow run's environment (a process worker's `env` job variable) reaches its stage jobs: update 0's
    # sample job holds before its commit until `release` exists, so it is surely in flight when the
    # flow-run process dies, and still when the resume arrives.
    hold = {"PROBEPO_PAUSE_AT": "0:sample:before-commit", "PROBEPO_PAUSE_MARK": str(paused),
            "PROBEPO_PAUSE_RELEASE": str(release)}  # fmt: skip
    with get_client(sync_client=True) as client:
        created = client.create_flow_run_from_deployment(
            deployments["train/ui-testbed"].id, parameters=parameters, job_variables={"env": hold}
        )
        _wait_until(paused.exists)
        [in_flight] = warm_store.jobs("flow-killed", 0, "sample")
        pid = _wait_until(lambda: client.read_flow_run(created.id).infrastructure_pid)
        os.kill(int(str(pid).rsplit(":", 1)[-1]), signal.SIGKILL)
        assert not _wait_for_end(created.id, timeout_s=120).state.is_completed()
        assert str(in_flight["job_id"]) in _in_squeue()  # the stage job outlived its driver
        resumed = client.create_flow_run_from_deployment(
            deployments["resume/resume"].id,
            parameters={"run_id": "flow-killed", "store": warm_store.url, "executor": "slurm",
                        "profile": str(profile_path)},
        )  # fmt: skip
        watching = f"sample · update 0 · job {in_flight['job_id']}"  # the resume waits on that very job
        _wait_until(lambda: watching in _task_run_names(resumed.id, 1), timeout_s=120)
        release.touch()
    assert _wait_for_end(resumed.id).state.is_completed()
    assert [job["job_id"] for job in warm_store.jobs("flow-killed", 0, "sample")] == [in_flight["job_id"]]
    assert all(
        len(warm_store.jobs("flow-killed", j["update"], j["stage"])) == 1
        for j in warm_store.jobs("flow-killed")
    )  # nothing submitted twice
    final = warm_store.read_stage("flow-killed", 1, "checkpoint")
    assert {name: final[name] for name in FILES} == drill_baseline


def test_the_nightly_deployment_is_scheduled_at_two_one_night_at_a_time(deployments):
    from prefect import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    nightly = deployments["nightly-eval/nightly-eval"]
    [schedule] = nightly.schedules
    assert (schedule.schedule.cron, schedule.schedule.timezone, schedule.active) == ("0 2 * * *", "UTC", True)
    assert nightly.global_concurrency_limit.limit == 1
    with get_client(sync_client=True) as client:
        scheduled = _wait_until(
            lambda: client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[nightly.id])),
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))
                ),
            ),
            timeout_s=60,
        )
    times = sorted(run.expected_start_time for run in scheduled)
    assert all((t.hour, t.minute) == (2, 0) for t in times) and len({t.date() for t in times}) == len(times)


def test_a_nightly_flow_run_is_named_after_the_night_it_was_scheduled_for(deployments):
    from datetime import UTC, datetime

    from prefect import get_client
    from prefect.states import Scheduled

    night = datetime(2026, 3, 14, 2, tzinfo=UTC)  # a night gone by: the worker runs it at once
    with get_client(sync_client=True) as client:
        created = client.create_flow_run_from_deployment(
            deployments["nightly-eval/nightly-eval"].id,
            parameters={"selection": {"runs": ["no-such-run"]}, "executor": "inline"},  # nothing to evaluate
            state=Scheduled(scheduled_time=night),
        )
    run = _wait_for_end(created.id, timeout_s=180)
    assert run.state.is_completed(), run.state.message
    assert run.name == "nightly-eval 2026-03-14"


def test_the_api_refuses_a_call_without_its_password():
    api, password = os.environ["PREFECT_API_URL"], os.environ["PREFECT_API_AUTH_STRING"]

    def call(auth: str | None) -> int:
        request = urllib.request.Request(f"{api}/flows/filter", data=b"{}", method="POST",
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        if auth is not None:
            request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status
        except urllib.error.HTTPError as refused:
            return refused.code

    assert (call(None), call("probepo:wrong"), call(password)) == (401, 401, 200)
