"""The tiny CPU-testbed recipe that pipeline, CLI and execution tests share (warm stores: ../conftest.py)."""

from __future__ import annotations

from probepo.config import RunConfig


def tiny_config(algorithm: str = "probepo", **fields: object) -> RunConfig:
    """4 prompts × 4 responses of 3-step mod-3 chains, 2 updates, 16 eval problems. The warm-up (about
    30 steps) stops at ≥ 20 % accuracy, so groups have mixed rewards and every stage sees real signal."""
    data = RunConfig().model_dump()
    data.update(num_updates=2, prompts_per_update=4, group_size=4)
    data["task"].update(steps=3, modulus=3)
    data["warmup"].update(
        accuracy_low=0.2, accuracy_high=0.6, check_every=10, check_problems=64, max_steps=400
    )
    data["eval"].update(problems=16, every=1)
    data["optim"].update(minibatch_size=6, microbatch_size=4)  # 16 responses -> 3 mini-batches
    data["algo"].update(algorithm=algorithm, max_pivots=2, continuations_per_pivot=3)
    data.update(fields)
    return RunConfig.model_validate(data)
