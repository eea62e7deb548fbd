"""Advantage: token advantages of the update's training rows under the run's method (the rules:
probepo.methods.advantages) and their diagnostics."""

from __future__ import annotations

from probepo.methods import method_for
from probepo.run.schedule import ADVANTAGES, Stage
from probepo.stages.common import StageInputs
from probepo.stages.context import StageContext
from probepo.store.formats import tensors_to_bytes

STAGE = Stage.ADVANTAGE


def run(ctx: StageContext) -> None:
    advantage = method_for(ctx.config.algo.algorithm).advantage
    tensors, summary = advantage(ctx.config.algo, StageInputs(ctx))
    ctx.commit(STAGE, {ADVANTAGES: tensors_to_bytes(tensors)}, summary)
