"""Checkpoint 0: policy 0 of a run, with a fresh optimizer state. A testbed run starts from the shared
supervised warm-up; a Hugging Face model's run starts from its pretrained weights (`model.pretrained`).

Later checkpoints are committed by the optimize stage: policy k + 1 is the `checkpoint` of update k + 1.
"""

from __future__ import annotations

from typing import Any

from probepo.engines.base import TrainerEngine
from probepo.engines.build import model_dtype, new_trainer
from probepo.models.gpt import load_model
from probepo.run.schedule import WARMUP_MODEL, Stage
from probepo.stages import warmup
from probepo.stages.committed import saved_trainer
from probepo.stages.context import StageContext
from probepo.stages.policy import policy_engines

STAGE = Stage.CHECKPOINT


def _from_warmup(ctx: StageContext) -> tuple[TrainerEngine, dict[str, Any]]:
    source = warmup.warmup_run_id(ctx.config)
    marker = ctx.store.marker(source, 0, warmup.STAGE)
    if marker is None:
        raise RuntimeError(
            f"warm-up run {source} has no committed checkpoint in {ctx.store.url}: run it first"
        )
    folder = ctx.scratch / "warmup-model"
    folder.mkdir(parents=True, exist_ok=True)
    for name in WARMUP_MODEL:
        ctx.store.download_stage_file(source, 0, warmup.STAGE, name, folder / name)
    summary = {"warmup_run": source, "warmup_accuracy": marker["summary"]["accuracy"]}
    return new_trainer(ctx.config, load_model(folder)), summary


def _from_pretrained(ctx: StageContext) -> tuple[TrainerEngine, dict[str, Any]]:
    from probepo.engines.hf import load_policy

    model, tokenizer = load_policy(ctx.config.model.pretrained, dtype=model_dtype(ctx.config.model))
    return new_trainer(ctx.config, model, tokenizer), {"pretrained": ctx.config.model.pretrained}


def run(ctx: StageContext) -> None:
    engine, summary = _from_pretrained(ctx) if ctx.config.model.kind == "hf" else _from_warmup(ctx)
    with saved_trainer(ctx, engine, ctx.scratch / "policy-000000") as files:
        ctx.commit(STAGE, files, summary)
    policy_engines(ctx).trainer_made(ctx, engine, 0)
