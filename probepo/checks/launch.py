"""A launch as its checks read it (`Launch`), and `check_launch`: every subject's check, in order.

The checks never import flows/ or slurm/ (tests/unit/test_import_graph.py): what they need of the executor
and of its backend comes in the `Launch`, through two small protocols that slurm/executors.py's `Executor`
and slurm/backends.py's `Backend` satisfy. slurm/check.py builds the launch (the recipe, the profile, the
executor and its backend answering) and runs `check_launch` over it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from probepo.checks import (
    credentials,
    data,
    environment,
    evaluation,
    jobs,
    kv_cache,
    memory,
    model,
    recipe,
    site,
    spend,
    store,
)
from probepo.checks.findings import Findings
from probepo.checks.model import ModelFiles, recipe_model
from probepo.config import ExecutionProfile, RunConfig
from probepo.run.schedule import Stage

if TYPE_CHECKING:
    from probepo.data import Task


class Jobs(Protocol):
    """What the checks read of an executor (slurm/executors.py's `Executor`)."""

    @property
    def stages(self) -> tuple[Stage, ...]:
        """The stages it submits as jobs."""
        ...

    @property
    def in_process(self) -> bool:
        """It runs everything in the calling process (no jobs)."""
        ...

    @property
    def resident(self) -> bool:
        """Its engines stay resident from stage to stage and update to update."""
        ...


class Site(Protocol):
    """What the checks ask of the executor's backend (slurm/backends.py's `Backend`)."""

    def site_findings(self, stages: Iterable[str]) -> Findings:
        """What the site says of the profile's resources for `stages` and of its job folder."""
        ...


@dataclass(frozen=True)
class Launch:
    """What a launch's checks read: the recipe as given and as validated, the execution profile, the
    executor (by name and as jobs) and its backend, each None where it did not parse or answer."""

    fields: Mapping[str, Any]
    """The recipe's fields as given (its store the one checked)."""
    config: RunConfig | None
    """The recipe, validated (None: it failed validation, which named its own failures)."""
    profile: ExecutionProfile | None
    executor_name: str
    executor: Jobs | None
    site: Site | None
    """The executor's backend, checked (None: in process, or it did not answer)."""

    @functools.cached_property
    def model(self) -> tuple[Findings, ModelFiles]:
        """The recipe's model files, read once for the checks that need them (model, data, memory,
        evaluation, spend)."""
        return recipe_model(self)

    @functools.cached_property
    def task(self) -> tuple[Findings, Task | None]:
        """The recipe's task as its jobs build it, built once for the checks that read it (data, KV cache):
        None, with a failure saying why, where it cannot be built (and of a recipe that failed validation)."""
        return (Findings(), None) if self.config is None else data.built_task(self.config)


SUBJECTS: tuple[Callable[[Launch], Findings], ...] = (
    model.check,
    data.check,
    store.check,
    jobs.check,
    memory.check,
    kv_cache.check,
    evaluation.check,
    spend.check,
    recipe.check,
    credentials.check,
    environment.check,
    site.check,
)
"""Every subject's check, in the order `probepo check` prints what they find."""


def check_launch(launch: Launch) -> Findings:
    """What every subject's check finds of `launch`, in order. Never raises for what it checks."""
    found = Findings()
    for check in SUBJECTS:
        found.extend(check(launch))
    return found
