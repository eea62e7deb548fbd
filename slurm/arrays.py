"""Many small independent jobs at once (the nightly evaluation: one per checkpoint and suite): SLURM job
arrays through submitit, split to the cluster's `MaxArraySize`; local subprocesses; or one after another in
this process (inline).

Unlike a stage, an item is never re-attached to after a restart: each one commits its own result
create-only in the store, so an item whose job died is simply missing there and done again next time.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from probepo.config import ExecutionProfile
from slurm import accounting
from slurm.backends import SlurmBackend

T = TypeVar("T")
DEFAULT_MAX_ARRAY_SIZE = 1001
"""SLURM's default MaxArraySize (indices 0..1000)."""

ArrayWatch = Callable[[str, int, Callable[[], None]], None]
"""Wraps the wait for one submitted array (its job id, its number of tasks, the wait itself)."""


@dataclass(frozen=True)
class ItemOutcome:
    """What became of one item: the job that ran it (None inline), its return value or its error."""

    index: int
    job_id: str | None
    result: Any = None
    error: str | None = None


def max_array_size() -> int:
    """The cluster's MaxArraySize (`scontrol show config`): an array's indices must stay below it."""
    shown = accounting._run(["scontrol", "show", "config"]).stdout
    found = re.search(r"^MaxArraySize\s*=\s*(\d+)", shown, re.MULTILINE)
    return int(found.group(1)) if found else DEFAULT_MAX_ARRAY_SIZE


def chunks(count: int, size: int) -> list[range]:
    """Item indices in runs of at most `size` (one job array each)."""
    return [range(start, min(start + size, count)) for start in range(0, count, size)]


def _error_of(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return "\n".join(lines[-12:]) or type(exc).__name__


def run_array(
    executor: str,
    fn: Callable[[T], Any],
    items: Sequence[T],
    profile: ExecutionProfile | None,
    *,
    name: str,
    stage: str = "evaluate",
    watch: ArrayWatch | None = None,
) -> list[ItemOutcome]:
    """Run `fn(item)` for every item and wait for all: with `executor` slurm as job arrays of at most
    MaxArraySize tasks with the profile's resources for `stage` (None: the defaults), local as
    subprocesses, inline here.
    Returns one outcome per item, in order; one item's failure does not stop the others."""
    if not items:
        return []
    if executor == "inline":
        outcomes = []
        for index, item in enumerate(items):
            try:
                outcomes.append(ItemOutcome(index, None, fn(item)))
            except Exception as exc:  # one item's error is its outcome, the others go on
                outcomes.append(ItemOutcome(index, None, error=_error_of(exc)))
        return outcomes

    import submitit

    profile = profile or ExecutionProfile()
    folder = Path(profile.job_folder).resolve() / name
    resources = profile.resources(stage)
    if executor == "slurm":
        backend = SlurmBackend(profile)
        backend.check()
        size = max_array_size()
        make = lambda: submitit.SlurmExecutor(folder=folder, max_num_timeout=0)  # noqa: E731
        parameters = backend.parameters(name, resources)
    elif executor == "local":
        size = len(items)
        make = lambda: submitit.LocalExecutor(folder=folder)  # noqa: E731
        parameters = {"timeout_min": resources.time_min}
    else:
        raise ValueError(f"executor {executor!r}: choose inline, local or slurm")

    arrays: list[list[Any]] = []  # all submitted before any wait: the scheduler sees the whole night
    for part in chunks(len(items), size):
        submitter = make()
        submitter.update_parameters(**parameters)
        arrays.append(submitter.map_array(fn, [items[i] for i in part]))
    for submitted in arrays:

        def wait(submitted: list[Any] = submitted) -> None:
            for job in submitted:
                job.wait()

        array_id = str(submitted[0].job_id).split("_", 1)[0]
        (watch or (lambda _id, _count, wait: wait()))(array_id, len(submitted), wait)
    jobs = [job for submitted in arrays for job in submitted]
    outcomes = []
    for index, job in enumerate(jobs):
        try:
            outcomes.append(ItemOutcome(index, str(job.job_id), job.result()))
        except Exception as exc:  # the job's error (submitit re-raises it, with the stderr's tail)
            outcomes.append(ItemOutcome(index, str(job.job_id), error=_error_of(exc)))
    return outcomes
