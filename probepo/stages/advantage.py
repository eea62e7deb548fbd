"""Advantage: token advantages of the backbone responses (ALGORITHM.md §1, §4, §6) and diagnostics."""

from __future__ import annotations

import torch

from probepo.algo.advantage import group_advantages, group_stats, redistribute, vineppo_advantages
from probepo.stages.common import ADVANTAGES, Rollouts, read_tensors
from probepo.stages.context import StageContext
from probepo.stages.probe import VALUES
from probepo.stages.select import PIVOTS
from probepo.store.formats import tensors_to_bytes

STAGE = "advantage"


def run(ctx: StageContext) -> None:
    algo = ctx.config.algo
    rollouts = Rollouts.read(ctx)
    mask = rollouts.mask
    pivots = read_tensors(ctx, "select", PIVOTS)["pivot_pos"]
    values = read_tensors(ctx, "probe", VALUES)["values"]
    mean, std = group_stats(rollouts.rewards, rollouts.group)
    seq_adv = group_advantages(
        rollouts.rewards, rollouts.group, scale=algo.advantage_scale, eps=algo.advantage_eps
    )
    if algo.algorithm == "vineppo":
        token_adv = vineppo_advantages(rollouts.rewards, mean, mask, pivots, values)
    else:
        scale = 1.0 if algo.residual_scale == "reward" else std.clamp_min(algo.residual_std_floor)
        token_adv = redistribute(
            seq_adv, rollouts.rewards, mean, mask, pivots, values, weight=algo.residual_weight, scale=scale
        )
    broadcast = torch.where(mask, seq_adv[:, None], 0.0)
    residual = (token_adv - broadcast)[mask].abs().mean() if mask.any() else torch.tensor(0.0)
    summary = {
        "seq_adv_abs_mean": float(seq_adv.abs().mean()),
        "token_adv_abs_mean": float(token_adv[mask].abs().mean()) if mask.any() else 0.0,
        "residual_abs_mean": float(residual),
        "zero_signal_fraction": float((std == 0).double().mean()),
    }
    ctx.commit(STAGE, {ADVANTAGES: tensors_to_bytes({"advantages": token_adv.float().contiguous()})}, summary)
