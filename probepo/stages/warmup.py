"""Warm-up: supervised training on worked solutions until accuracy enters a target window.

It runs as the single stage of its own run, `warmup-<hash of task, model and warm-up settings>`, in the
same store, so every training run with those settings reuses one committed starting checkpoint.
"""

from __future__ import annotations

import copy
import hashlib
import json

import torch

from probepo.config import RunConfig
from probepo.data.task import WARMUP_CHECK_STREAM
from probepo.engines.sampler import TorchGenerationEngine
from probepo.engines.sft import accuracy, sft_steps
from probepo.models.gpt import GPT, save_model
from probepo.run.schedule import WARMUP_MODEL, Stage
from probepo.stages.common import sampling_params, task_of
from probepo.stages.context import StageContext, derive_seed

STAGE = Stage.WARMUP
KEY_FIELDS = ("task", "model", "sampling", "warmup")
"""The parts of a run's config that determine its warm-up checkpoint."""
KEY_LEFT_OUT = {"sampling": {"shards"}}
"""Fields of KEY_FIELDS outside the key: how a stage groups its chunks into engine calls never reaches the
warm-up, whose checks decode on an engine of their own (and the key must not move when such a field comes)."""
KEY_VERSION = 2
"""Bumped whenever the warm-up computes something else from the same settings, so that a store made by
older code never serves its warm-up as current (2: checks seeded from the key, not the run seed)."""


def warmup_run_id(config: RunConfig) -> str:
    """The warm-up run shared by every run with the same task, model, sampling and warm-up settings."""
    hashed = config.hashed()
    key = {
        name: getattr(hashed, name).model_dump(mode="json", exclude=KEY_LEFT_OUT.get(name))
        for name in KEY_FIELDS
    }
    key["version"] = KEY_VERSION
    return "warmup-" + hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def run(ctx: StageContext) -> None:
    cfg, settings = ctx.config, ctx.config.warmup
    # Every random choice derives from the warm-up's own key: the runs sharing it differ in their own
    # seed, and whichever of them happens to make the warm-up must not change it.
    key = warmup_run_id(cfg)
    task = task_of(ctx)
    torch.manual_seed(settings.seed)
    model = GPT(cfg.model)
    sampler = TorchGenerationEngine(model)  # shares the parameters being trained
    params = sampling_params(ctx, task)
    # Checks use a fixed set of train problems: the eval split stays unseen by checkpoint selection.
    check_set = task.batch(WARMUP_CHECK_STREAM, settings.seed, 0, settings.check_problems)
    history: list[tuple[int, float]] = []
    previous: tuple[int, float, dict[str, torch.Tensor]] | None = None
    chosen = None
    for step in sft_steps(model, task, batch_size=settings.batch_size, lr=settings.lr, seed=settings.seed):
        if step.step % settings.check_every:
            continue
        acc = accuracy(sampler, task, check_set, params, seed=derive_seed(key, "check", step.step))
        history.append((step.step, acc))
        current = (step.step, acc, copy.deepcopy(model.state_dict()))
        if acc >= settings.accuracy_low:
            # Overshot the window: keep whichever of this check and the previous one is closer to it.
            overshoot = acc - settings.accuracy_high
            if overshoot > 0 and previous is not None and settings.accuracy_low - previous[1] < overshoot:
                current = previous
            chosen = current
            break
        if step.step >= settings.max_steps:
            best = max(history, key=lambda h: h[1])
            raise RuntimeError(
                f"warm-up reached no accuracy >= warmup.accuracy_low = {settings.accuracy_low} in"
                f" {settings.max_steps} steps (best {best[1]:.3f} at step {best[0]}): raise warmup.max_steps"
                " or warmup.lr, or lower warmup.accuracy_low"
            )
        previous = current
    assert chosen is not None
    steps, acc, state = chosen
    model.load_state_dict(state)
    folder = ctx.scratch / f"{ctx.run_id}-model"
    save_model(model, folder)
    ctx.commit(
        STAGE,
        {name: folder / name for name in WARMUP_MODEL},
        {"steps": steps, "accuracy": acc, "history": history, "check_problems": len(check_set)},
    )
