"""The `train` and `resume` flows: the driver loop of `probepo.pipeline` with every stage a Prefect task run
(flows/runner.py), the stage jobs submitted by the execution layer of `slurm/`.

The run config is the flow's parameter, so the deployment's run form is the pydantic model (its field
docstrings are the form's descriptions). Prefect checks each field against the schema; the flow checks the
whole config (the cross-field rules) before anything is submitted. What the UI shows per run: a progress
artifact (updates done of the total, updated in place), a table of metrics per update, a markdown
report, and where a run that starts again resumes. Cancelling a flow run ends its stage jobs and records
the cancellation in the store; a later `resume` completes the run.
"""

from __future__ import annotations

import re
from typing import Any
from uuid import UUID

from prefect import flow, get_client, get_run_logger
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.client.schemas.objects import StateType
from prefect.runtime import flow_run
from prefect.states import Cancelled, State

from flows.runner import shown_in_prefect
from probepo.config import RunConfig
from probepo.errors import ExecutionError
from probepo.pipeline import recorded_updates, resume_point
from probepo.pipeline import train as drive
from probepo.preemption import Preempted
from probepo.presets import ConfigError, load_profile, validate_run_config, with_overrides
from probepo.report import load_curves, markdown
from probepo.schedule import Stage
from probepo.store import ArtifactStore, open_store
from slurm import JobRunner, make_runner
from slurm.executors import ExecutorName


def artifact_key(run_id: str, what: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{run_id}-{what}".lower()).strip("-")


class Progress:
    """The run's progress artifact: the share of its updates whose optimizer step is committed."""

    def __init__(self, run_id: str, num_updates: int) -> None:
        self.num_updates = max(num_updates, 1)
        self.artifact = create_progress_artifact(
            0.0, key=artifact_key(run_id, "progress"), description=f"run {run_id}: updates done"
        )

    def __call__(self, update: int, stage: str, summary: dict[str, Any], ran: bool) -> None:
        if stage == Stage.OPTIMIZE:
            update_progress_artifact(self.artifact, 100.0 * (update + 1) / self.num_updates)


def show_resume_point(store: ArtifactStore, run_id: str, config: RunConfig) -> None:
    """When a run starts again, where it goes on: a markdown artifact (the driver logs it too)."""
    if run_id not in store.runs():  # a first start: its recipe is frozen by the driver
        return
    start = resume_point(store, run_id, config)
    if start.done:
        return
    inside = f" (committed inside it: {', '.join(start.partials)})" if start.partials else ""
    create_markdown_artifact(
        f"# Run {run_id} resumed\n\nat update {start.update} of {config.num_updates}, stage"
        f" `{start.stage}`{inside}; everything before is committed in `{store.url}` and is not run again.",
        key=artifact_key(run_id, "resume"),
        description=f"run {run_id}: where it resumed",
    )


def publish_results(store: ArtifactStore, run_id: str) -> None:
    """The metrics table and the markdown report of a run, as artifacts of this flow run."""
    records = store.read_metrics(run_id)
    columns = sorted({key for record in records for key in record if key == "update" or "/" in key})
    table = [{key: record.get(key) for key in columns} for record in records]
    create_table_artifact(table, key=artifact_key(run_id, "metrics"), description=f"run {run_id}: per update")
    report = f"# Run {run_id}\n\nstore: `{store.url}`\n\n" + markdown([load_curves(store, run_id)])
    report += f"\n\nPlots: `probepo report {run_id} --store {store.url}`.\n"
    create_markdown_artifact(report, key=artifact_key(run_id, "report"), description=f"run {run_id}: report")


def _drive(
    config: RunConfig,
    run_id: str,
    executor: ExecutorName,
    profile: str | None,
    store: ArtifactStore | None = None,
) -> list[dict[str, Any]] | State:
    logger = get_run_logger()
    try:
        config = validate_run_config(config.model_dump(mode="json"), f"flow parameter config of run {run_id}")
        runner = make_runner(executor, load_profile(profile))
    except (ConfigError, ExecutionError) as exc:
        raise ValueError(str(exc)) from None  # before any job is submitted
    store = store or open_store(config.store)
    show_resume_point(store, run_id, config)
    try:
        metrics = drive(
            config,
            run_id,
            store=store,
            progress=Progress(run_id, config.num_updates),
            say=logger.info,
            runner=shown_in_prefect(runner),
        )
    except Preempted:
        if not cancel_requested():
            raise  # preempted: the flow run crashes, `resume` goes on from the store
        # the record first: a resume ends any job this process dies before ending (JobRunner._in_flight)
        jobs = runner.open_jobs(store, run_id) if isinstance(runner, JobRunner) else []
        ids = [str(job["job_id"]) for job in jobs]
        store.record_cancellation(run_id, {"by": f"Prefect flow run {flow_run.get_id()}", "jobs": ids})
        if isinstance(runner, JobRunner):
            runner.cancel_jobs(store, run_id, jobs)
        message = f"run {run_id} cancelled; stage jobs ended: {', '.join(ids) or 'none'}"
        logger.info(message)
        return Cancelled(message=message)  # a returned state is the flow run's final state
    publish_results(store, run_id)
    return metrics


def cancel_requested() -> bool:
    """Whether this flow run's SIGTERM is a cancellation (its state on the server: cancelling), not a
    preemption of the process that runs it. Both arrive as SIGTERM on a process worker."""
    flow_run_id = flow_run.get_id()
    if flow_run_id is None:
        return False
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(UUID(str(flow_run_id))).state
    return state is not None and state.type in (StateType.CANCELLING, StateType.CANCELLED)


@flow(name="train", flow_run_name="train {run_id}", log_prints=True)
def train(
    config: RunConfig, run_id: str, executor: ExecutorName = "inline", profile: str | None = None
) -> list[dict[str, Any]] | State:
    """Train (or resume) run `run_id` with `config`: every stage of every update committed to the store.
    `executor`: where stages run (inline: this process; local: a subprocess each; slurm: a SLURM job each;
    resident: one SLURM job runs them all, engines resident, as `checkpoint_every` > 1 needs);
    `profile`: the execution profile (YAML path) of the job resources."""
    return _drive(config, run_id, executor, profile)


@flow(name="resume", flow_run_name="resume {run_id}", log_prints=True)
def resume(
    run_id: str, store: str = "./store", executor: ExecutorName = "inline", profile: str | None = None
) -> list[dict[str, Any]] | State:
    """Continue run `run_id` from what `store` holds (its frozen recipe): committed stages are skipped, a
    stage job still in flight is waited for, never submitted again."""
    opened = open_store(store)
    config = validate_run_config(opened.read_run(run_id)["config"], f"run {run_id}: its stored recipe")
    config = with_overrides(config, num_updates=recorded_updates(opened, run_id))
    return _drive(config, run_id, executor, profile, opened)
