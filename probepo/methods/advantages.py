"""Advantage rules: a method's token advantages for the update's training rows (ALGORITHM.md §1, §4, §6;
the tree baselines: BASELINES.md), with the diagnostics the advantage stage commits beside them.

Each rule is pure: (the algo config, update k's inputs) -> (tensors, summary): `advantages` [R, T] float32
over the R training rows, optionally LOSS_MASK [R, T] bool (the tokens in the loss), and a flat dict of
floats.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from probepo.algo.advantage import (
    group_advantages,
    group_stats,
    redistribute,
    rloo_advantages,
    vineppo_advantages,
)
from probepo.algo.spo_tree import spo_token_advantages, spo_tree_advantages
from probepo.algo.tree import leaf_ancestors
from probepo.algo.treepo import treepo_advantages, treepo_normalize
from probepo.config.algo import AlgoConfig
from probepo.methods.inputs import Rollouts, UpdateInputs

AdvantageRule = Callable[[AlgoConfig, UpdateInputs], tuple[dict[str, Tensor], dict[str, float]]]
"""(the run's algo config, update k's inputs) -> (tensors, summary), as above."""
LOSS_MASK = "loss_mask"
"""The tensor of the advantage stage's file that, where present, marks the tokens in the loss (spo_tree's
probability mask)."""


def redistributed(algo: AlgoConfig, inputs: UpdateInputs) -> tuple[dict[str, Tensor], dict[str, float]]:
    """GRPO's advantage per response, redistributed across its tokens by the probed prefix values (§4);
    with no pivots (GRPO) every token gets exactly the response's advantage."""
    rollouts, pivots, values = inputs.rollouts, inputs.pivots, inputs.values
    mean, std = group_stats(rollouts.rewards, rollouts.group)
    seq_adv = group_advantages(
        rollouts.rewards, rollouts.group, scale=algo.advantage_scale, eps=algo.advantage_eps
    )
    scale = 1.0 if algo.residual_scale == "reward" else std.clamp_min(algo.residual_std_floor)
    token_adv = redistribute(
        seq_adv,
        rollouts.rewards,
        mean,
        rollouts.mask,
        pivots,
        values,
        weight=algo.residual_weight,
        scale=scale,
    )
    return _per_response(rollouts, seq_adv, token_adv, std)


def dense_monte_carlo(algo: AlgoConfig, inputs: UpdateInputs) -> tuple[dict[str, Tensor], dict[str, float]]:
    """VinePPO's: each segment's value difference, whitened over the batch, no GRPO term (§6)."""
    rollouts, pivots, values = inputs.rollouts, inputs.pivots, inputs.values
    mean, std = group_stats(rollouts.rewards, rollouts.group)
    seq_adv = group_advantages(  # only for the diagnostics, comparable with GRPO's
        rollouts.rewards, rollouts.group, scale=algo.advantage_scale, eps=algo.advantage_eps
    )
    token_adv = vineppo_advantages(rollouts.rewards, mean, rollouts.mask, pivots, values)
    return _per_response(rollouts, seq_adv, token_adv, std)


def leave_one_out(algo: AlgoConfig, inputs: UpdateInputs) -> tuple[dict[str, Tensor], dict[str, float]]:
    """RLOO's: the response's reward minus the mean of its group's other rewards, on every token."""
    rollouts = inputs.rollouts
    seq_adv = rloo_advantages(rollouts.rewards, rollouts.group)
    _, std = group_stats(rollouts.rewards, rollouts.group)
    return _per_response(rollouts, seq_adv, torch.where(rollouts.mask, seq_adv[:, None], 0.0), std)


def spo_tree(algo: AlgoConfig, inputs: UpdateInputs) -> tuple[dict[str, Tensor], dict[str, float]]:
    """SPO-tree: one row per edge, every token with the edge's advantage, masked and whitened (§SPO-tree)."""
    rollouts, tree, scores = inputs.rollouts, inputs.tree, inputs.scores
    edges = tree["parent"] >= 0
    edge_adv = spo_tree_advantages(
        tree["parent"], tree["depth"], _node_rewards(tree, rollouts), adv=algo.spo_adv
    )[edges]
    token_adv, loss_mask = spo_token_advantages(
        edge_adv, scores["mask"], scores["logp"], prob_mask=algo.spo_prob_mask
    )
    summary = {
        "edge_adv_abs_mean": float(edge_adv.abs().mean()),
        "token_adv_abs_mean": float(token_adv[loss_mask].abs().mean()) if loss_mask.any() else 0.0,
        "rows": int(edges.sum()),
        "zero_advantage_rows": int((edge_adv == 0).sum()),  # dropped from the batch
        "prob_masked_fraction": _fraction(
            scores["mask"] & (edge_adv != 0)[:, None] & ~loss_mask, scores["mask"]
        ),
    }
    tensors = {"advantages": token_adv.float().contiguous(), LOSS_MASK: loss_mask.contiguous()}
    return tensors, summary


def treepo(algo: AlgoConfig, inputs: UpdateInputs) -> tuple[dict[str, Tensor], dict[str, float]]:
    """TreePO: one row per leaf path, every token with its nested-subgroup advantage, normalised over the
    batch's response tokens (§TreePO 5–8)."""
    rollouts, tree = inputs.rollouts, inputs.tree
    leaves, ancestors = leaf_ancestors(tree["parent"], tree["depth"])
    rows = tree["row"][leaves]
    leaf_adv = treepo_advantages(ancestors, rollouts.rewards[rows], agg=algo.treepo_agg)
    lengths = rollouts.mask.sum(dim=1)
    normalised = treepo_normalize(leaf_adv, lengths[rows], center=algo.treepo_center)
    seq_adv = torch.zeros(len(rollouts.responses), dtype=normalised.dtype)
    seq_adv[rows] = normalised
    summary = {
        "seq_adv_abs_mean": float(seq_adv.abs().mean()),
        "subgroup_adv_abs_mean": float(leaf_adv.abs().mean()),
        "zero_advantage_rows": int((seq_adv == 0).sum()),
    }
    token_adv = torch.where(rollouts.mask, seq_adv[:, None], 0.0)
    return {"advantages": token_adv.float().contiguous()}, summary


def _per_response(
    rollouts: Rollouts, seq_adv: Tensor, token_adv: Tensor, group_std: Tensor
) -> tuple[dict[str, Tensor], dict[str, float]]:
    """The files and diagnostics of a method with one row per response: seq_adv [N] (the per-response
    advantage), token_adv [N, T] and group_std [N] (each response's group reward std, as the caller has
    it); the residual is what the tokens carry beyond the broadcast seq_adv."""
    mask = rollouts.mask
    broadcast = torch.where(mask, seq_adv[:, None], 0.0)
    residual = (token_adv - broadcast)[mask].abs().mean() if mask.any() else torch.tensor(0.0)
    summary = {
        "seq_adv_abs_mean": float(seq_adv.abs().mean()),
        "token_adv_abs_mean": float(token_adv[mask].abs().mean()) if mask.any() else 0.0,
        "residual_abs_mean": float(residual),
        "zero_signal_fraction": float((group_std == 0).double().mean()),
    }
    return {"advantages": token_adv.float().contiguous()}, summary


def _node_rewards(tree: dict[str, Tensor], rollouts: Rollouts) -> Tensor:
    """[Nn] float64: each leaf's reward (its rollout row's), 0 elsewhere."""
    reward = torch.zeros(tree["parent"].shape, dtype=torch.float64)
    leaves = tree["row"] >= 0
    reward[leaves] = rollouts.rewards[tree["row"][leaves]]
    return reward


def _fraction(part: Tensor, whole: Tensor) -> float:
    return float(part.sum() / whole.sum()) if whole.any() else 0.0
