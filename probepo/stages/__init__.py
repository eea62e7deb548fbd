"""The pipeline stages (DESIGN.md, "One update k"): one module each, `run(ctx)` commits through the store.

No stage imports Prefect or submitit: each runs the same inline, in a subprocess or in a SLURM job.
"""

from __future__ import annotations

from collections.abc import Callable

from probepo.stages import advantage, checkpoint, evaluate, optimize, probe, sample, score, select, warmup
from probepo.stages.context import StageContext

STAGES: dict[str, Callable[[StageContext], None]] = {
    module.STAGE: module.run
    for module in (warmup, checkpoint, evaluate, sample, score, select, probe, advantage, optimize)
}
