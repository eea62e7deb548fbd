"""The `train` and `resume` flows: the driver loop of `probepo.pipeline` with every stage a Prefect task run
(flows/runner.py), the stage jobs submitted by the execution layer of `slurm/`.

The run config is the flow's parameter, so a deployment's run form is the pydantic model (its field
docstrings are the form's descriptions) opened on the deployment's preset (flows/deployments.py). The form
checks each field against the schema; the flow checks the rest before anything is submitted — the rules
across fields, the profile, the model's and data's files, the store (probepo.preflight) — and refuses a
run that fails with a one-line state message and a markdown artifact, no traceback.

What the UI shows per run, whatever the executor: a progress artifact (updates committed of the total) and
a table of metrics per update, both updated as each update commits (with the resident executor the flow
reads them from the store while its one job runs), a markdown report and a table of its cost per stage at
the end (GPU-hours from SLURM's accounting; wall time only for an inline run), and where a run that
starts again resumes. TensorBoard events go to `<job folder>/<run id>/tensorboard`. A failing stage's
error and the end of its job's log are in the flow's log. Cancelling a flow run ends its stage jobs and
records the cancellation in the store; a later `resume` completes the run.
"""

from __future__ import annotations

import re
from pathlib import Path
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
from prefect.runtime import deployment, flow_run
from prefect.states import Cancelled, Failed, State

from flows.runner import shown_in_prefect
from probepo import spend
from probepo.config import RunConfig
from probepo.costs import RunCosts
from probepo.errors import ExecutionError
from probepo.pipeline import recorded_updates, resume_point
from probepo.pipeline import train as drive
from probepo.preemption import Preempted
from probepo.preflight import WORKER_ENV_EXAMPLE, Refused, missing_environment
from probepo.presets import ConfigError, validate_run_config, with_overrides
from probepo.report import load_curves, markdown
from probepo.schedule import Stage
from probepo.store import ArtifactStore, StoreError, open_store
from slurm import JobRunner
from slurm.check import launchable
from slurm.costs import run_costs, stage_totals
from slurm.executors import ExecutorName
from slurm.holders import holder_ended


def artifact_key(run_id: str, what: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{run_id}-{what}".lower()).strip("-")


def run_id_of(given: str | None) -> str:
    """The run id a flow run trains: the one given, else `<deployment>-<8 hex digits of the flow run's
    id>`, so an untouched form starts a new run and a retry of the same flow run resumes it."""
    if given:
        return given
    return f"{deployment.name or 'run'}-{str(flow_run.get_id() or '')[:8] or 'local'}"


def _train_run_name() -> str:
    return f"train {run_id_of(flow_run.parameters.get('run_id'))}"


def refused(what: str, problems: list[str]) -> State:
    """The flow run ends Failed with `problems` in its one-line message, and a markdown artifact listing
    them; nothing was submitted."""
    line = "; ".join(problems)
    get_run_logger().error(f"refused: {line}")
    listed = "\n".join(f"- {item}" for item in problems)
    create_markdown_artifact(
        f"# {what} refused\n\n{listed}\n\nNothing was submitted; fix these and start it again.",
        key=artifact_key(what, "refused"),
        description=f"{what}: why it did not start",
    )
    return Failed(message=f"refused: {line}")


class Published:
    """The run's progress artifact (committed updates of the total) and metrics table, updated as each
    update's optimizer step commits: a ProgressFn of the driver, also fed from the store while a resident
    job runs."""

    def __init__(self, store: ArtifactStore, run_id: str, num_updates: int) -> None:
        self.store, self.run_id, self.num_updates = store, run_id, max(num_updates, 1)
        done = len(
            {int(record["update"]) for record in store.read_metrics(run_id) if "optimize/loss" in record}
        )
        self.artifact = create_progress_artifact(
            100.0 * done / self.num_updates,
            key=artifact_key(run_id, "progress"),
            description=f"run {run_id}: updates done",
        )

    def __call__(self, update: int, stage: str, summary: dict[str, Any], ran: bool) -> None:
        if stage == Stage.OPTIMIZE and ran:
            update_progress_artifact(self.artifact, 100.0 * (update + 1) / self.num_updates)
            self.metrics()

    def metrics(self) -> None:
        """The metrics table of every update committed so far (the spend counters, ~40 columns, left to
        TensorBoard and `probepo report`)."""
        records = self.store.read_metrics(self.run_id)
        columns = sorted(
            {
                key
                for record in records
                for key in record
                if (key == "update" or "/" in key) and not spend.is_spend_metric(key)
            }
        )
        table = [{key: record.get(key) for key in columns} for record in records]
        create_table_artifact(
            table, key=artifact_key(self.run_id, "metrics"), description=f"run {self.run_id}: per update"
        )


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


def publish_costs(store: ArtifactStore, run_id: str) -> RunCosts:
    """What the run cost per stage, as a table artifact: GPU-hours and CPU-hours of its SLURM jobs (every
    run of a requeued job; slurm/costs.py) and each stage's wall time; a run without accounted jobs
    (inline, local executor) shows its wall time only."""
    costs = run_costs(store, run_id)
    table = [
        {
            "stage": cost.stage,
            "GPU-hours": None if costs.wall_time_only else round(cost.gpu_hours, 4),
            "CPU-hours": None if costs.wall_time_only else round(cost.cpu_hours, 4),
            "wall (s)": round(cost.wall_s, 1),
        }
        for cost in stage_totals(costs)
    ]
    create_table_artifact(
        table, key=artifact_key(run_id, "costs"), description=f"run {run_id}: cost per stage"
    )
    return costs


def publish_report(store: ArtifactStore, run_id: str, costs: RunCosts) -> None:
    """The markdown report of a finished run (with its GPU-hours where `costs` accounts for its jobs), as
    an artifact of this flow run."""
    report = f"# Run {run_id}\n\nstore: `{store.url}`\n\n" + markdown([load_curves(store, run_id, costs)])
    report += f"\n\nPlots: `probepo report {run_id} --store {store.url}`.\n"
    create_markdown_artifact(report, key=artifact_key(run_id, "report"), description=f"run {run_id}: report")


def worker_lacks(config: RunConfig | dict[str, Any]) -> list[str]:
    """A refusal's last problem where the worker's environment lacks what the run reads (a worker started
    by cron or systemd has only what its env file sets): none where it lacks nothing."""
    try:
        recipe = config if isinstance(config, RunConfig) else validate_run_config(config, "config")
    except ConfigError:
        return []
    missing = missing_environment(recipe)
    if not missing:
        return []
    return [
        f"the worker's environment has no {'; '.join(missing)}: set them in its env file"
        f" (~/.probepo/worker/env; {WORKER_ENV_EXAMPLE} lists what the flows read)"
    ]


def _drive(
    config: RunConfig | dict[str, Any],
    run_id: str,
    executor: ExecutorName,
    profile: str | None,
    store: ArtifactStore | None = None,
) -> list[dict[str, Any]] | State:
    logger = get_run_logger()
    try:
        config, execution, runner, warnings = launchable(config, executor, profile)
        for warning in warnings:
            logger.warning(warning)
        store = store or open_store(config.store)
        show_resume_point(store, run_id, config)
    except Refused as exc:
        return refused(f"run {run_id}", [*exc.problems, *worker_lacks(config)])
    except StoreError as exc:
        return refused(f"run {run_id}", [str(exc)])
    published = Published(store, run_id, config.num_updates)
    events = Path(execution.job_folder).resolve() / run_id / "tensorboard"
    try:
        metrics = drive(
            config,
            run_id,
            store=store,
            progress=published,
            say=logger.info,
            runner=shown_in_prefect(runner),
            tensorboard_dir=events,  # the resident executor's job writes its own, there too
            holder_ended=holder_ended,  # a lease left by a driver job that ended is taken over at once
            retention=execution.retention,
        )
    except Preempted:
        if not cancel_requested():
            raise  # preempted: the flow run crashes, `resume` goes on from the store
        return _cancel(store, run_id, runner)
    except (ConfigError, StoreError) as exc:  # the run's own state: a recipe mismatch, a lease held
        return refused(f"run {run_id}", str(exc).splitlines())
    except ExecutionError as exc:  # a stage failed in its job: its error and the end of its log
        logger.error(str(exc))
        return Failed(message=str(exc).splitlines()[0])
    published.metrics()
    publish_report(store, run_id, publish_costs(store, run_id))
    return metrics


def _cancel(store: ArtifactStore, run_id: str, runner: Any) -> State:
    """Record the cancellation, end the run's jobs, and end the flow run Cancelled, saying which jobs."""
    # the record first: a resume ends any job this process dies before ending (JobRunner._in_flight)
    jobs = runner.open_jobs(store, run_id) if isinstance(runner, JobRunner) else []
    ids = [str(job["job_id"]) for job in jobs]
    store.record_cancellation(run_id, {"by": f"Prefect flow run {flow_run.get_id()}", "jobs": ids})
    if isinstance(runner, JobRunner):
        runner.cancel_jobs(store, run_id, jobs)
    message = f"run {run_id} cancelled; jobs ended: {', '.join(ids) or 'none'}"
    get_run_logger().info(message)
    return Cancelled(message=message)


def cancel_requested() -> bool:
    """Whether this flow run's SIGTERM is a cancellation (its state on the server: cancelling), not a
    preemption of the process that runs it. Both arrive as SIGTERM on a process worker."""
    flow_run_id = flow_run.get_id()
    if flow_run_id is None:
        return False
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(UUID(str(flow_run_id))).state
    return state is not None and state.type in (StateType.CANCELLING, StateType.CANCELLED)


@flow(name="train", flow_run_name=_train_run_name, log_prints=True, validate_parameters=False)
def train(
    config: RunConfig,
    run_id: str | None = None,
    executor: ExecutorName = "inline",
    profile: str | None = None,
) -> list[dict[str, Any]] | State:
    """Train (or resume) a run: every stage of every update committed to the store.

    Args:
        config: The run's recipe (each train deployment opens on its preset, configs/NAME.yaml). The
            form checks each field; the rules across fields, the model's and the data's files and the store
            are checked when the flow run starts, before any job: a run that fails is refused in one line.
        run_id: The run's name in the store; the same id again resumes that run. Empty: the deployment's
            name and the flow run's first 8 hex digits (a retry of the flow run resumes it).
        executor: Where stages run: inline (the worker's own process), local (a subprocess each), slurm (a
            SLURM job each), resident (one SLURM job runs them all, engines resident, as checkpoint_every
            > 1 needs).
        profile: The execution profile (a YAML path on the worker's machine): the SLURM resources of each
            stage and the job folder; needed by slurm and resident.
    """
    return _drive(config, run_id_of(run_id), executor, profile)


@flow(name="resume", flow_run_name="resume {run_id}", log_prints=True, validate_parameters=False)
def resume(
    run_id: str, store: str | None = None, executor: ExecutorName = "inline", profile: str | None = None
) -> list[dict[str, Any]] | State:
    """Continue a run from what its store holds (its frozen recipe): committed stages are skipped, a stage
    job still in flight is waited for, never submitted again.

    Args:
        run_id: The run to continue.
        store: The store that holds it (s3://bucket/prefix or a folder); the site's by default.
        executor: Where its remaining stages run (it may differ from before: the bits do not).
        profile: The execution profile (a YAML path on the worker's machine); needed by slurm and resident.
    """
    if not store:
        return refused(f"run {run_id}", ["no store given: set the store parameter (or the site's store)"])
    try:
        opened = open_store(store)
        config = validate_run_config(opened.read_run(run_id)["config"], f"run {run_id}: its stored recipe")
        config = with_overrides(config, num_updates=recorded_updates(opened, run_id), store=store)
    except (ConfigError, StoreError) as exc:
        return refused(f"run {run_id}", str(exc).splitlines())
    return _drive(config, run_id, executor, profile, opened)
