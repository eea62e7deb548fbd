"""The executors, as one registry: where the stages of a run go, by the name users give (`--executor`,
the flows' `executor` parameter). A new executor is one entry here and, if it submits jobs somewhere
new, one backend (backends.py); nothing else names executors.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from probepo.config import ExecutionProfile
from probepo.errors import ExecutionError
from probepo.run.execution import InlineRunner, StageRunner
from probepo.run.schedule import STAGES, Stage, resident_refusal
from slurm.backends import Backend, SlurmBackend
from slurm.local_backend import LocalBackend
from slurm.runner import DriverJobRunner, JobRunner


@dataclass(frozen=True)
class Executor:
    """One way of running a run's stages."""

    about: str
    """What it does, for help texts."""
    backend: Callable[[ExecutionProfile], Backend] | None
    """Where its jobs go; None: it runs everything in this process."""
    runner: Callable[[Backend | None, ExecutionProfile], StageRunner]
    """Its stage runner, given its backend (checked already) and the execution profile."""
    arrays: bool = True
    """It can run many small jobs at once (the nightly evaluation's arrays)."""
    needs_profile: bool = False
    """Its jobs need the site's execution profile (partitions, job folder): an unattended flow refuses to
    start without one."""
    stages: tuple[Stage, ...] = ()
    """The stages it submits as jobs, whose resources `probepo check` verifies against the site."""
    resident: bool = False
    """Its engines stay resident from stage to stage and update to update (its runner's `resident`): what
    `checkpoint_every` > 1 needs."""

    @property
    def in_process(self) -> bool:
        """It runs everything in the calling process (no jobs)."""
        return self.backend is None


STAGE_JOBS = tuple(STAGES)
"""What the executors with a job per stage submit: every stage of the stage table."""

EXECUTORS: dict[str, Executor] = {
    "inline": Executor("this process", None, lambda backend, profile: InlineRunner(), resident=True),
    "local": Executor(
        "a subprocess per stage (submitit's LocalExecutor)",
        LocalBackend,
        lambda backend, profile: JobRunner(backend, profile),
        stages=STAGE_JOBS,
    ),
    "slurm": Executor(
        "a SLURM job per stage",
        SlurmBackend,
        lambda backend, profile: JobRunner(backend, profile),
        needs_profile=True,
        stages=STAGE_JOBS,
    ),
    "resident": Executor(
        "one SLURM job runs the driver and every stage, engines resident: what checkpoint_every > 1 needs",
        functools.partial(SlurmBackend, executor="resident"),
        lambda backend, profile: DriverJobRunner(backend, profile),
        arrays=False,
        needs_profile=True,
        stages=(Stage.DRIVER,),
        resident=True,
    ),
}

ExecutorName = Literal[tuple(EXECUTORS)]  # type: ignore[valid-type]
"""Any executor's name: the flows' `executor` parameter (a choice in the UI form)."""
ArrayExecutorName = Literal[tuple(name for name, e in EXECUTORS.items() if e.arrays)]  # type: ignore[valid-type]
"""The executors that run job arrays: the evaluation flows' `executor` parameter."""


class UnknownExecutor(ExecutionError):
    user_error = True


def executor_for(name: str, *, arrays: bool = False) -> Executor:
    """The executor named `name` (one that runs arrays if `arrays`); an unknown name is refused, naming the
    choices."""
    choices = [n for n, e in EXECUTORS.items() if e.arrays or not arrays]
    if name not in choices:
        raise UnknownExecutor(f"executor {name!r}: choose one of {', '.join(choices)}")
    return EXECUTORS[name]


def executor_that_runs(executor: str, checkpoint_every: int) -> str:
    """`executor`, unless its engines do not stay resident between updates as a recipe's `checkpoint_every`
    needs (probepo.run.schedule.resident_refusal); then `resident`. What a site's default becomes for a
    recipe:
    the CLI's default and a deployment's form alike."""
    if resident_refusal(checkpoint_every) and not executor_for(executor).resident:
        return "resident"
    return executor


def make_runner(name: str, profile: ExecutionProfile | None = None) -> StageRunner:
    """The stage runner of the executor `name`; checks first that it can submit (SlurmUnavailable)."""
    executor = executor_for(name)
    profile = profile or ExecutionProfile()
    backend = None
    if executor.backend is not None:
        backend = executor.backend(profile)
        backend.check(executor.stages)
    return executor.runner(backend, profile)


def executor_help() -> str:
    """One line per executor, for --help."""
    return "; ".join(f"{name} ({executor.about})" for name, executor in EXECUTORS.items())
