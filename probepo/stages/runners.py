"""Every stage's `run`, by the stage's name: what the executors call, resolved from the stage table
(probepo.run.schedule.STAGES names each stage's module)."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module

from probepo.run import schedule
from probepo.stages.context import StageContext

STAGES: schedule.StageTable[Callable[[StageContext], None]] = schedule.StageTable(
    {stage: import_module(spec.module).run for stage, spec in schedule.STAGES.items()}
)
