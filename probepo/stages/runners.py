"""Every stage's `run`, by the stage's name: what the executors call."""

from __future__ import annotations

from collections.abc import Callable

from probepo.stages import advantage, checkpoint, evaluate, optimize, probe, sample, score, select, warmup
from probepo.stages.context import StageContext

STAGES: dict[str, Callable[[StageContext], None]] = {
    module.STAGE: module.run
    for module in (warmup, checkpoint, evaluate, sample, score, select, probe, advantage, optimize)
}
