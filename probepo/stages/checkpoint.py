"""Checkpoint 0: the warm-up weights with a fresh optimizer state (policy 0 of a run).

Later checkpoints are committed by the optimize stage: policy k + 1 is the `checkpoint` of update k + 1.
"""

from __future__ import annotations

from probepo.models.gpt import load_model
from probepo.stages import warmup
from probepo.stages.common import CHECKPOINT, POLICY_FILES, new_trainer
from probepo.stages.context import StageContext

STAGE = CHECKPOINT


def run(ctx: StageContext) -> None:
    source = warmup.warmup_run_id(ctx.config)
    marker = ctx.store.marker(source, 0, warmup.STAGE)
    if marker is None:
        raise RuntimeError(
            f"warm-up run {source} has no committed checkpoint in {ctx.store.url}: run it first"
        )
    folder = ctx.scratch / "warmup-model"
    folder.mkdir(parents=True, exist_ok=True)
    for name in warmup.MODEL_FILES:
        ctx.store.download_stage_file(source, 0, warmup.STAGE, name, folder / name)
    engine = new_trainer(ctx, load_model(folder))
    policy = ctx.scratch / "policy-000000"
    engine.save(policy)
    summary = {"warmup_run": source, "warmup_accuracy": marker["summary"]["accuracy"]}
    ctx.commit(STAGE, {name: policy / name for name in POLICY_FILES}, summary)
