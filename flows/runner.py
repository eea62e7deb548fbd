"""A stage runner that shows each stage in Prefect: a task run per stage (inline and other in-process
runners) or per job (`slurm.JobRunner`: one task run per submitted or re-attached job, named with its id).

A cancelled flow run ends each job's task run Cancelled (naming the job) and its own state Cancelled with
the driver's line (`end_cancelled`), kept over the generic one Prefect's runner sets after the flow's
process has exited (flows/cancelled.py).

Prefect never retries a task here: a job that died without committing (node failure, out of memory, a
requeue that never ran) is resubmitted by the JobRunner itself, which reads why it ended from SLURM's
accounting and the store; a stage's own error ends the run. Prefect retries would re-run the whole wait
without that knowledge.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar
from uuid import UUID

from prefect import get_client, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import StateType
from prefect.runtime import flow_run
from prefect.states import Cancelled, Completed, State

from flows.cancelled import keep_after_the_runner
from probepo.run.execution import StageRequest, StageRunner
from probepo.run.schedule import Stage
from probepo.stages.context import StageContext
from slurm import JobRunner
from slurm.accounting import JobInfo
from slurm.runner import DriverJobRunner, DriverStopped

T = TypeVar("T")


@task(cache_policy=NO_CACHE, persist_result=False, retries=0, log_prints=True)
def stage_task(work: Callable[[], T]) -> T:
    """Run `work` as one task run (its name is set per call)."""
    return work()


def task_name(request: StageRequest, job_id: str | None = None) -> str:
    """E.g. `sample · update 3 · job 1234`: what the UI lists for a stage (and its job); the warm-up (a run
    of its own, before any update) and the resident executor's one job are named without an update."""
    job = f" · job {job_id}" if job_id else ""
    if request.stage == Stage.DRIVER:  # the resident executor's one job: every stage of every update left
        return f"driver{job}"
    if request.stage == Stage.WARMUP:
        return f"warm-up{job}"
    return f"{request.stage} · update {request.update}{job}"


class PrefectStageRunner:
    """Runs stages through `inner`, each stage (or each of its jobs) inside a named Prefect task run."""

    def __init__(self, inner: StageRunner) -> None:
        self.inner = inner
        self.stopped_watching: str | None = None
        """The run whose job this flow run was waiting for when its driver was stopped: its own, or the
        warm-up's where it was making it (a cancel ends that run's jobs too)."""
        if isinstance(inner, JobRunner):
            inner.watch = self._watch_job

    @property
    def resident(self) -> bool:
        return self.inner.resident

    @property
    def for_driver(self) -> StageRunner | DriverJobRunner:
        """What the driver is given: this, or the resident executor's runner itself, to which the driver
        hands the whole run (its one job is one task run, `driver · job <id>`)."""
        return self.inner if isinstance(self.inner, DriverJobRunner) else self

    def run(self, request: StageRequest, ctx: StageContext) -> None:
        if isinstance(self.inner, JobRunner):
            self.inner.run(request, ctx)  # its jobs are the task runs
        else:
            stage_task.with_options(task_run_name=task_name(request))(lambda: self.inner.run(request, ctx))

    def _watch_job(self, request: StageRequest, job_id: str, wait: Callable[[], JobInfo]) -> JobInfo:
        stopped: list[DriverStopped] = []

        def waiting() -> JobInfo | State:
            try:
                return wait()
            except DriverStopped as exc:
                stopped.append(exc)
                if cancel_requested():  # the flow ends the job next (flows/train.py: _cancel)
                    return Cancelled(message=f"job {job_id} cancelled with the run")
                # the flow's process was stopped: the job goes on, this task run stops watching it
                return Completed(message=f"stopped watching job {job_id}, which goes on")

        state = stage_task.with_options(task_run_name=task_name(request, job_id))(waiting, return_state=True)
        if stopped:
            self.stopped_watching = request.run_id
            raise stopped[0]
        return state.result()


def cancel_requested() -> bool:
    """Whether this flow run's SIGTERM is a cancellation (its state on the server: cancelling), not a
    preemption of the process that runs it. Both arrive as SIGTERM on a process worker."""
    flow_run_id = flow_run.get_id()
    if flow_run_id is None:
        return False
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(UUID(str(flow_run_id))).state
    return state is not None and state.type in (StateType.CANCELLING, StateType.CANCELLED)


def end_cancelled(message: str) -> State:
    """The flow run's Cancelled state with our message, so the run's page says what ended: forced over the
    server's Cancelling now, and set again over the line Prefect's runner sets once this process has
    exited (flows/cancelled.py)."""
    flow_run_id = flow_run.get_id()
    if flow_run_id is not None:
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(UUID(str(flow_run_id)), Cancelled(message=message), force=True)
        keep_after_the_runner(UUID(str(flow_run_id)), message)
    # a new state object: the one sent now names the flow run, and the engine would read it as an
    # upstream state ("1/1 states cancelled") instead of the flow's own
    return Cancelled(message=message)
