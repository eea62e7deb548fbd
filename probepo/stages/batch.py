"""The rows update k trains on, under the run's method: what score scores and optimize (and its replay)
trains on."""

from __future__ import annotations

from probepo.engines.base import TrainBatch
from probepo.methods import method_for
from probepo.methods.advantages import LOSS_MASK
from probepo.methods.inputs import TrainingRows
from probepo.run.schedule import ADVANTAGES, SCORES, Stage
from probepo.stages.common import StageInputs, read_tensors
from probepo.stages.context import StageContext


def training_rows(ctx: StageContext) -> TrainingRows:
    """The training rows of update k under the run's method (`Method.rows`)."""
    return method_for(ctx.config.algo.algorithm).rows(StageInputs(ctx))


def training_batch(ctx: StageContext) -> TrainBatch:
    """Update k's training data as committed: the training rows, their old log-probs and token advantages.
    Where the advantage stage committed a loss mask (spo_tree), the rows it leaves empty are dropped."""
    rows = training_rows(ctx)
    old_logp = read_tensors(ctx, Stage.SCORE, SCORES)["logp"]
    advantages = read_tensors(ctx, Stage.ADVANTAGE, ADVANTAGES)
    loss_mask = advantages.get(LOSS_MASK)
    if loss_mask is None:
        return TrainBatch(rows.prompts, rows.responses, old_logp, advantages["advantages"])
    keep = loss_mask.any(dim=1).nonzero().squeeze(1)
    return TrainBatch(
        prompts=[rows.prompts[i] for i in keep.tolist()],
        responses=[rows.responses[i] for i in keep.tolist()],
        old_logp=old_logp[keep],
        advantages=advantages["advantages"][keep],
        loss_mask=loss_mask[keep],
    )
