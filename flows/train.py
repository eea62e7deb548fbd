"""The `train` and `resume` flows: the driver loop of `probepo.run.pipeline` with every stage a Prefect task
run
(flows/runner.py), the stage jobs submitted by the execution layer of `slurm/`.

The run config is the flow's parameter, so a deployment's run form is the pydantic model (its field
docstrings are the form's descriptions) opened on the deployment's preset (flows/deployments.py). The form
checks each field against the schema; the flow checks the rest before anything is submitted — the rules
across fields, the profile, the model's and data's files, the store (probepo/checks/) — and refuses a
run that fails with a one-line state message and a markdown artifact, no traceback.

What the UI shows per run, whatever the executor (flows/artifacts.py): its progress (a percent, the
updates committed of the total), a table of the numbers a user scans per update and one of every metric
by stage, and charts of its curves over the whole run (held-out accuracy and reward by update), each
updated in place as each update commits (with the resident executor the flow reads them from the store
while its one job runs), a markdown report and a table of its cost per stage at the end (GPU-hours from
SLURM's accounting; wall time only for an inline run), and where a run that starts again resumes.
TensorBoard events go to `<job folder>/<run id>/tensorboard`. A failing stage's error and the end of its
job's log are in the flow's log. Cancelling a flow run ends its stage jobs and records the cancellation in
the store, and its state message says so (what ended, which jobs, how to go on); a later `resume`
completes the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import deployment, flow_run
from prefect.states import Failed, State

from flows.artifacts import Published, publish_costs, publish_report, refused, show_resume_point
from flows.runner import PrefectStageRunner, cancel_requested, end_cancelled
from probepo.checks.environment import WORKER_ENV_EXAMPLE, missing_environment
from probepo.checks.findings import Refused
from probepo.config import RunConfig
from probepo.errors import ExecutionError
from probepo.presets import ConfigError, validate_run_config, with_overrides
from probepo.run.pipeline import recorded_updates
from probepo.run.pipeline import train as drive
from probepo.run.preemption import Preempted
from probepo.run.schedule import Stage
from probepo.stages.warmup import warmup_run_id
from probepo.store import ArtifactStore, StoreError, open_store
from probepo.store.outage import RIDER, OutageBudget
from slurm import JobRunner
from slurm.check import launchable
from slurm.executors import ExecutorName
from slurm.holders import holder_ended
from slurm.runner import DriverJobRunner


def run_id_of(given: str | None) -> str:
    """The run id a flow run trains: the one given, else `<deployment>-<8 hex digits of the flow run's
    id>`, so an untouched form starts a new run and a retry of the same flow run resumes it."""
    if given:
        return given
    return f"{deployment.name or 'run'}-{str(flow_run.get_id() or '')[:8] or 'local'}"


def _train_run_name() -> str:
    return f"train {run_id_of(flow_run.parameters.get('run_id'))}"


def worker_lacks(config: RunConfig | dict[str, Any]) -> list[str]:
    """What the worker's environment lacks that the run reads (a worker started by cron or systemd has only
    what its env file sets), in one line: a warning in the flow's log of a run that starts, a refused run's
    last problem; none where it lacks nothing."""
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
        # the checks may pass without what the worker lacks (a model in the default cache, no
        # HF_HUB_OFFLINE), which the jobs it submits still miss: said whether refused or not
        for warning in [*warnings, *worker_lacks(config)]:
            logger.warning(warning)
        store = store or open_store(config.store)
        show_resume_point(store, run_id, config)
        if isinstance(runner, DriverJobRunner) and (line := _warm_up_line(config, store)):
            logger.info(line)
    except Refused as exc:
        return refused(f"run {run_id}", [*exc.problems, *worker_lacks(config)])
    except StoreError as exc:
        return refused(f"run {run_id}", [str(exc)])
    shown = PrefectStageRunner(runner)
    events = Path(execution.job_folder).resolve() / run_id / "tensorboard"
    outage = OutageBudget(execution.store_outage_s)  # how long an unreachable store is waited for
    try:
        with RIDER.configured(outage):
            published = Published(store, run_id, config.num_updates)
            metrics = drive(
                config,
                run_id,
                store=store,
                progress=published,
                say=logger.info,
                runner=shown.for_driver,
                tensorboard_dir=events,  # the resident executor's job writes its own, there too
                holder_ended=holder_ended,  # a lease left by a driver job that ended is taken over at once
                retention=execution.retention,
            )
            published.metrics()
    except Preempted:
        if not cancel_requested():
            raise  # preempted: the flow run crashes, `resume` goes on from the store
        return _cancel(store, run_id, runner, shown.stopped_watching)
    except (ConfigError, StoreError) as exc:  # the run's own state: a recipe mismatch, a lease held
        return refused(f"run {run_id}", str(exc).splitlines())
    except ExecutionError as exc:  # a stage failed in its job: its error and the end of its log
        logger.error(str(exc))
        return Failed(message=str(exc).splitlines()[0])
    with RIDER.configured(outage):
        publish_report(store, run_id, publish_costs(store, run_id))
    return metrics


def _cancel(store: ArtifactStore, run_id: str, runner: Any, stopped_watching: str | None) -> State:
    """Record the cancellation, end the run's jobs, and end the flow run Cancelled with a line saying what
    ended, which jobs, and how to go on (cancel_line). `stopped_watching`: the run whose job the driver was
    waiting for when it stopped; where that is the warm-up this run was making, its jobs end too (a warm-up
    another run is making, or one made long ago, is left alone)."""
    logger = get_run_logger()
    runs = list(dict.fromkeys(run for run in (run_id, stopped_watching) if run))
    # the records first: a resume ends any job this process dies before ending (JobRunner._in_flight), and
    # a job that sees its run cancelled does not requeue itself
    jobs = {run: runner.open_jobs(store, run) if isinstance(runner, JobRunner) else [] for run in runs}
    ids = [str(job["job_id"]) for listed in jobs.values() for job in listed]
    for run in runs:
        store.record_cancellation(run, {"by": f"Prefect flow run {flow_run.get_id()}", "jobs": ids})
    if isinstance(runner, JobRunner):
        for run, listed in jobs.items():
            runner.cancel_jobs(store, run, listed)
    message = cancel_line(run_id, runs[1] if len(runs) > 1 else None, ids)
    logger.info(message)
    if ids:
        logger.info(
            "each job's task run above ended Cancelled with this cancel: Prefect's task engine logs"
            " `Finished in state Cancelled` at ERROR, its level for every end but Completed; nothing failed"
        )
    return end_cancelled(message)


def cancel_line(run_id: str, warm_up: str | None, job_ids: list[str]) -> str:
    """A cancelled run's one line (its flow run's state message): the run, and the warm-up it was making
    where that ended too, the jobs ended, and how to go on from what is committed."""
    making = f" with the warm-up {warm_up} it was making" if warm_up else ""
    return (
        f"run {run_id} cancelled{making}; jobs ended: {', '.join(job_ids) or 'none'}; to go on, run the"
        f" resume deployment with run_id {run_id}"
    )


def _warm_up_line(config: RunConfig, store: ArtifactStore) -> str | None:
    """What a resident run's driver job starts from, for the flow's log (the job's own log says it, this
    process's driver does not): the warm-up it reuses, or one the job makes first; None without a warm-up
    (a Hugging Face model starts from its pretrained weights)."""
    if config.model.kind != "testbed":
        return None
    warm_up = warmup_run_id(config)
    if store.committed(warm_up, 0, Stage.WARMUP):
        return f"warm-up: {warm_up} (reused: the driver job starts from it)"
    return f"warm-up: {warm_up} is not made yet: the driver job makes it first"


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
