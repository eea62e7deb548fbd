"""Score: one forward pass of policy k over the update's training rows (the rollouts, or spo_tree's edges):
old log-probs (PPO ratio, SPO-tree's probability mask) and full-vocabulary entropies (the pivot selector),
logits divided by the sampling temperature."""

from __future__ import annotations

from probepo import spend
from probepo.run.schedule import SCORES, Stage
from probepo.stages.batch import training_rows
from probepo.stages.context import StageContext
from probepo.stages.policy import scoring_engine
from probepo.store.formats import tensors_to_bytes

STAGE = Stage.SCORE


def run(ctx: StageContext) -> None:
    rows = training_rows(ctx)
    engine = scoring_engine(ctx)
    with spend.timed("scoring"):
        logp, entropy, mask = engine.score(rows.prompts, rows.responses)
    summary = {
        "entropy_mean": float(entropy[mask].mean()) if mask.any() else 0.0,
        "logp_mean": float(logp[mask].mean()) if mask.any() else 0.0,
    }
    ctx.commit(STAGE, {SCORES: tensors_to_bytes({"logp": logp, "entropy": entropy, "mask": mask})}, summary)
