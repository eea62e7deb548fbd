"""The recipe: validated (every rule across its fields, and what it needs of its task:
probepo.presets.validate_run_config) into what the other checks read, and its checkpoint_every against the
executor's engines."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from probepo.checks.findings import Findings
from probepo.config import RunConfig
from probepo.presets import ConfigError, validate_run_config
from probepo.run.schedule import resident_refusal

if TYPE_CHECKING:
    from probepo.checks.launch import Launch


def parsed(fields: Mapping[str, Any], source: str) -> tuple[RunConfig | None, Findings]:
    """The recipe of `fields` (read from `source`) and a line saying it holds; None and a failure per
    problem where it does not."""
    found = Findings()
    try:
        c = validate_run_config(fields, source)
    except ConfigError as exc:
        found.failures += str(exc).splitlines()
        return None, found
    found.passed.append(
        f"recipe: {source}: {c.algo.algorithm} on {c.task.kind} with the {c.model.kind} model,"
        " every rule across fields holds"
    )
    return c, found


def check(launch: Launch) -> Findings:
    """Whether the executor can run the recipe's checkpoint_every (of a recipe that failed validation, its
    field as given)."""
    config, executor = launch.config, launch.executor
    checkpoint_every = (
        config.checkpoint_every if config is not None else launch.fields.get("checkpoint_every", 1)
    )
    if not isinstance(checkpoint_every, int) or isinstance(checkpoint_every, bool):
        return Findings()  # not a number: its field's failure says so
    refusal = resident_refusal(checkpoint_every)
    if refusal and executor is not None and not executor.resident:
        return Findings(failures=[f"executor {launch.executor_name}: {refusal}"])
    return Findings()
