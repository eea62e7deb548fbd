"""Select: where the run's method probes (ALGORITHM.md §2; the rules: probepo.methods.pivots), reward-free,
committed as [N, M] pivot positions (-1 = none)."""

from __future__ import annotations

from torch import Tensor

from probepo.methods import method_for
from probepo.methods.inputs import Rollouts
from probepo.run.schedule import PIVOTS, Stage
from probepo.stages.common import StageInputs, read_rollouts
from probepo.stages.context import StageContext
from probepo.store.formats import tensors_to_bytes

STAGE = Stage.SELECT


def choose_pivots(ctx: StageContext, rollouts: Rollouts) -> Tensor:
    """[N, M] long pivot positions (-1 = none) of the update's responses under the run's method."""
    rule = method_for(ctx.config.algo.algorithm).pivots
    return rule(ctx.config.algo, StageInputs(ctx, rollouts), ctx.seed(STAGE))


def run(ctx: StageContext) -> None:
    pivots = choose_pivots(ctx, read_rollouts(ctx))
    count = int((pivots >= 0).sum())
    summary = {"pivots": count, "probed_responses": int((pivots >= 0).any(1).sum()) if pivots.numel() else 0}
    ctx.commit(STAGE, {PIVOTS: tensors_to_bytes({"pivot_pos": pivots.contiguous()})}, summary)
