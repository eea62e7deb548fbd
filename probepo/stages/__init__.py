"""The pipeline stages (DESIGN.md, "One update k"): one module each, `run(ctx)` commits through the store.

No stage imports Prefect or submitit: each runs the same inline, in a subprocess or in a SLURM job.
"""

from __future__ import annotations

from collections.abc import Callable

from probepo.config import RunConfig
from probepo.stages import advantage, checkpoint, evaluate, optimize, probe, sample, score, select, warmup
from probepo.stages.context import StageContext

TRAINING_STAGES = ("sample", "score", "select", "probe", "advantage", "optimize")
"""The stages of one update, in order."""

STAGES: dict[str, Callable[[StageContext], None]] = {
    module.STAGE: module.run
    for module in (warmup, checkpoint, evaluate, sample, score, select, probe, advantage, optimize)
}


def stages_for_update(config: RunConfig, update: int) -> list[str]:
    """The stages the driver runs for update k: checkpoint 0 first (k = 0; later checkpoints come from
    optimize), an evaluation of policy k when due, then training (not after the last update, where only
    the final evaluation runs)."""
    stages = [checkpoint.STAGE] if update == 0 else []
    if update % config.eval.every == 0 or update == config.num_updates:
        stages.append("evaluate")
    if update < config.num_updates:
        stages.extend(TRAINING_STAGES)
    return stages
