"""A stage runner that shows each stage in Prefect: a task run per stage (inline and other in-process
runners) or per job (`slurm.JobRunner`: one task run per submitted or re-attached job, named with its id).

Prefect never retries a task here: a job that died without committing (node failure, out of memory, a
requeue that never ran) is resubmitted by the JobRunner itself, which reads why it ended from SLURM's
accounting and the store; a stage's own error ends the run. Prefect retries would re-run the whole wait
without that knowledge.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed, State

from probepo.execution import StageRequest, StageRunner
from probepo.schedule import Stage
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
    """E.g. `sample · update 3 · job 1234`: what the UI lists for a stage (and its job)."""
    job = f" · job {job_id}" if job_id else ""
    if request.stage == Stage.DRIVER:  # the resident executor's one job: every stage of every update left
        return f"driver{job}"
    return f"{request.stage} · update {request.update}{job}"


class PrefectStageRunner:
    """Runs stages through `inner`, each stage (or each of its jobs) inside a named Prefect task run."""

    def __init__(self, inner: StageRunner) -> None:
        self.inner = inner
        if isinstance(inner, JobRunner):
            inner.watch = self._watch_job

    @property
    def resident(self) -> bool:
        return self.inner.resident

    def run(self, request: StageRequest, ctx: StageContext) -> None:
        if isinstance(self.inner, JobRunner):
            self.inner.run(request, ctx)  # its jobs are the task runs
        else:
            stage_task.with_options(task_run_name=task_name(request))(lambda: self.inner.run(request, ctx))

    @staticmethod
    def _watch_job(request: StageRequest, job_id: str, wait: Callable[[], JobInfo]) -> JobInfo:
        stopped: list[DriverStopped] = []

        def waiting() -> JobInfo | State:
            try:
                return wait()
            except DriverStopped as exc:  # the job goes on: this task run stops watching, it did not fail
                stopped.append(exc)
                return Completed(message=f"stopped watching job {job_id}, which goes on")

        state = stage_task.with_options(task_run_name=task_name(request, job_id))(waiting, return_state=True)
        if stopped:
            raise stopped[0]
        return state.result()


def shown_in_prefect(runner: StageRunner) -> StageRunner | DriverJobRunner:
    """`runner` with its stages (or jobs) as task runs; the resident executor's one driver job is one task
    run `driver · job <id>`."""
    shown = PrefectStageRunner(runner)  # sets a job runner's watch
    return runner if isinstance(runner, DriverJobRunner) else shown
