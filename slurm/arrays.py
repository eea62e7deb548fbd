"""Many small independent jobs at once (the nightly evaluation: one per checkpoint and suite): SLURM job
arrays through submitit, split to the cluster's `MaxArraySize`; local subprocesses; or one after another in
this process (inline). Each executor's backend submits them (backends.py).

Unlike a stage, an item is never re-attached to after a restart: each one commits its own result
create-only in the store, so an item whose job died is simply missing there and done again next time.
An item's function is given a stop flag (raised by USR2 or SIGTERM: a preemption or the time limit's
warning); on SLURM or locally the signal abandons what the item is doing at once, but for a commit in
progress (slurm/job.py: AbandoningStop), and the task requeues itself (run_array_task), its next run going
on from what the item had committed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from probepo.config import ExecutionProfile
from probepo.run.schedule import Stage
from probepo.stages.context import never_stop
from slurm.accounting import JobCost
from slurm.executors import executor_for
from slurm.job import run_array_task

T = TypeVar("T")

ArrayWork = Callable[[T, Callable[[], bool]], Any]
"""One item's work: `fn(item, should_stop)`, which may stop at a safe point by raising Preempted."""

ArrayWatch = Callable[[str, int, Callable[[], None]], None]
"""Wraps the wait for one submitted array (its job id, its number of tasks, the wait itself)."""


@dataclass(frozen=True)
class ItemOutcome:
    """What became of one item: the job that ran it (None inline), its return value or its error."""

    index: int
    job_id: str | None
    result: Any = None
    error: str | None = None
    cost: JobCost | None = None
    """Its job's allocation × elapsed time from accounting (None: inline, local, or not accounted)."""


def _error_of(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return "\n".join(lines[-12:]) or type(exc).__name__


def run_array(
    executor: str,
    fn: ArrayWork[T],
    items: Sequence[T],
    profile: ExecutionProfile | None,
    *,
    name: str,
    stage: Stage = Stage.EVAL_TASK,
    parallelism: int | None = None,
    watch: ArrayWatch | None = None,
) -> list[ItemOutcome]:
    """Run `fn(item, should_stop)` for every item and wait for all: through the executor's backend as job
    arrays (on SLURM of at most MaxArraySize tasks each, at most `parallelism` running at once) with the
    profile's resources for `stage` (None: the defaults), or one after another in this process for an executor
    without one (inline).
    Returns one outcome per item, in order; one item's failure does not stop the others."""
    if not items:
        return []
    chosen = executor_for(executor, arrays=True)
    if chosen.backend is None:
        outcomes = []
        for index, item in enumerate(items):
            try:
                outcomes.append(ItemOutcome(index, None, fn(item, never_stop)))
            except Exception as exc:  # one item's error is its outcome, the others go on
                outcomes.append(ItemOutcome(index, None, error=_error_of(exc)))
        return outcomes

    profile = profile or ExecutionProfile()
    backend = chosen.backend(profile)
    backend.check()
    folder = Path(profile.job_folder).resolve() / name
    task = functools.partial(run_array_task, fn)
    arrays = backend.submit_arrays(task, items, profile.resources(stage), folder, parallelism)
    for submitted in arrays:

        def wait(submitted: list[Any] = submitted) -> None:
            for job in submitted:
                job.wait()

        array_id = str(submitted[0].job_id).split("_", 1)[0]
        (watch or (lambda _id, _count, wait: wait()))(array_id, len(submitted), wait)
    jobs = [job for submitted in arrays for job in submitted]
    costs = backend.costs(str(job.job_id) for job in jobs) or {}
    outcomes = []
    for index, job in enumerate(jobs):
        job_id, cost = str(job.job_id), costs.get(str(job.job_id))
        try:
            outcomes.append(ItemOutcome(index, job_id, job.result(), cost=cost))
        except Exception as exc:  # the job's error (submitit re-raises it, with the stderr's tail)
            outcomes.append(ItemOutcome(index, job_id, error=_error_of(exc), cost=cost))
    return outcomes


def job_costs(executor: str, profile: ExecutionProfile | None, job_ids: Iterable[str]) -> dict[str, JobCost]:
    """What these jobs cost (an item's jobs of earlier nights, say), from the executor's accounting, keyed as
    `ItemOutcome.job_id`; {} where it keeps none (inline, local) or does not answer."""
    chosen = executor_for(executor, arrays=True)
    wanted = list(job_ids)
    if chosen.backend is None or not wanted:
        return {}
    return chosen.backend(profile or ExecutionProfile()).costs(wanted) or {}
