"""The train and resume flows against a real Prefect server (infra/prefect, started by scripts/test): every
stage a named task run, the run's artifacts, the same bits as the plain driver, bad input refused before
anything runs."""

from __future__ import annotations

import json
import time
from uuid import UUID

import pytest

from probepo.run.pipeline import train
from probepo.run.schedule import stages_for_update
from slurm.accounting import job_costs
from slurm.costs import run_costs
from tests.flows import NEEDS_PREFECT
from tests.pipeline.conftest import tiny_config

pytestmark = [
    pytest.mark.integration,
    NEEDS_PREFECT,
]

FILES = ("model.safetensors", "optimizer.safetensors", "trainer.json")


def _task_run_names(flow_run_id: UUID, expected: int) -> set[str]:
    """Task runs reach the server as events: wait until `expected` of them are there (at most 30 s)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    names: set[str] = set()
    with get_client(sync_client=True) as client:
        for _ in range(150):
            runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
            )
            names = {run.name for run in runs}
            if len(names) >= expected:
                break
            time.sleep(0.2)
    return names


def test_the_train_flow_names_every_stage_publishes_artifacts_and_matches_the_driver(warm_store):
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    from flows.train import resume as resume_flow
    from flows.train import train as train_flow

    config = tiny_config(num_updates=2, store=warm_store.url)
    state = train_flow(config, "flow-train", return_state=True)
    assert state.is_completed(), state.message
    flow_run_id = state.state_details.flow_run_id
    train(config, "flow-reference", store=warm_store)  # the plain driver, inline
    final = {name: warm_store.read_stage("flow-train", 2, "checkpoint")[name] for name in FILES}
    assert final == {name: warm_store.read_stage("flow-reference", 2, "checkpoint")[name] for name in FILES}

    stages = [(u, s) for u in range(3) for s in stages_for_update(u, num_updates=2, eval_every=1)]
    names = _task_run_names(flow_run_id, len(stages))
    assert names == {f"{stage} · update {update}" for update, stage in stages}
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(flow_run_id).name == "train flow-train"
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    by_type = {artifact.type: artifact for artifact in artifacts}
    assert set(by_type) >= {"progress", "table", "markdown"}
    assert by_type["progress"].data == 100.0 and "Run flow-train" in by_type["markdown"].data
    assert by_type["progress"].key == "flow-train-progress"
    assert by_type["progress"].description == "run flow-train: 100.0% (2 of 2 updates done)"
    # one metrics table and one chart for the flow run, kept current in place over its 2 updates
    [metrics] = [artifact for artifact in artifacts if artifact.key == "flow-train-metrics"]
    table = json.loads(metrics.data) if isinstance(metrics.data, str) else metrics.data
    assert [row["update"] for row in table] == [0, 1, 2] and next(iter(table[0])) == "update"
    [curves] = [artifact for artifact in artifacts if artifact.key == "flow-train-curves"]
    assert "2 of 2 updates done" in curves.data and "held-out accuracy" in curves.data
    [costs] = [artifact for artifact in artifacts if artifact.key == "flow-train-costs"]
    rows = json.loads(costs.data) if isinstance(costs.data, str) else costs.data
    assert rows[-1]["stage"] == "run" and rows[-1]["GPU-hours"] is None  # inline: wall time only
    assert rows[-1]["wall (s)"] == pytest.approx(sum(row["wall (s)"] for row in rows[:-1]), abs=0.5)

    again = resume_flow("flow-train", store=warm_store.url, return_state=True)  # complete: nothing to run
    assert again.is_completed() and _task_run_names(again.state_details.flow_run_id, 0) == set()


def test_bad_input_is_refused_before_anything_runs_in_one_line(warm_store):
    from flows.train import train as train_flow

    def refusal(*args: object, **kwargs: object) -> str:
        state = train_flow(*args, **kwargs, return_state=True)
        assert state.is_failed() and "\n" not in state.message, state.message
        return state.message

    data = tiny_config(store=warm_store.url).model_dump(mode="json")
    data["task"].update(kind="pointer", letters=5, hops=10)  # cross-field: hops % letters == 0
    data["model"]["vocab_size"] = 13
    assert refusal(data, "flow-bad").startswith(
        "refused: config: task: hops = 10 is a multiple of letters = 5"
    )
    data["task"]["windw"] = 8  # a per-field error names the field
    assert "config: task.windw: no such field" in refusal(data, "flow-bad")
    tiny = tiny_config(store=warm_store.url)
    assert "/nonexistent/profile.yaml: cannot read" in refusal(
        tiny, "flow-bad-profile", profile="/nonexistent/profile.yaml"
    )
    assert "flow-bad" not in warm_store.runs() and "flow-bad-profile" not in warm_store.runs()


def test_with_the_slurm_executor_each_job_is_a_task_run_named_with_its_id(
    warm_store, profile_path, drill_baseline
):
    from flows.train import train as train_flow
    from tests.slurm.conftest import drill_config

    config = drill_config(store=warm_store.url)
    state = train_flow(config, "flow-slurm", executor="slurm", profile=str(profile_path), return_state=True)
    assert state.is_completed(), state.message
    final = warm_store.read_stage("flow-slurm", 1, "checkpoint")
    assert {name: final[name] for name in FILES} == drill_baseline
    jobs = {
        f"{stage} · update {update} · job {record['job_id']}"
        for update in range(2)
        for stage in stages_for_update(update, num_updates=1, eval_every=10)
        for record in warm_store.jobs("flow-slurm", update, stage)
    }
    assert len(jobs) == 9 and _task_run_names(state.state_details.flow_run_id, len(jobs)) == jobs


def test_with_the_resident_executor_one_driver_job_is_one_task_run(warm_store, profile_path, drill_baseline):
    """checkpoint_every 3 from the UI's train flow: one SLURM job runs every stage, engines resident."""
    from flows.train import train as train_flow
    from tests.slurm.conftest import drill_config

    config = drill_config(store=warm_store.url, checkpoint_every=3)
    state = train_flow(
        config, "flow-resident", executor="resident", profile=str(profile_path), return_state=True
    )
    assert state.is_completed(), state.message
    final = warm_store.read_stage("flow-resident", 1, "checkpoint")
    assert {name: final[name] for name in FILES} == drill_baseline
    [job] = warm_store.jobs("flow-resident", 0, "driver")
    assert {a["job_id"] for a in warm_store.attempts("flow-resident")} == {job["job_id"]}
    assert _task_run_names(state.state_details.flow_run_id, 1) == {f"driver · job {job['job_id']}"}
    # the driver job's accounted cost, split over the stages it ran, adds up to what sacct -D charged it
    charged = job_costs([job["job_id"]])[job["job_id"]]
    costs = run_costs(warm_store, "flow-resident")
    assert costs.accounted_jobs == 1 and len(costs.stages) > 1 and charged.cpu_seconds > 0
    assert costs.cpu_hours == pytest.approx(charged.cpu_hours)
