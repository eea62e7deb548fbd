"""SPO-tree (BASELINES.md §SPO-tree): node values, edge advantages, the probability mask and batch whitening
of its training rows (one per tree edge), and the sampler's branching plan. Trees as in probepo.algo.tree."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from probepo.algo.advantage import masked_whiten
from probepo.algo.tree import check_tree, float_values, segment_mean

__all__ = ["spo_children", "spo_prob_mask", "spo_token_advantages", "spo_tree_advantages", "spo_tree_values"]

SpoAdv = Literal["diff", "sibling_std"]


def spo_tree_values(parent: Tensor, depth: Tensor, reward: Tensor) -> Tensor:
    """SPO-tree node values (BASELINES.md §SPO-tree 3): V(leaf) = r(leaf); V(n) = mean of V over n's children.

    The mean runs over a node's children, not over its leaves (SPO's code): with early finishers a shallow
    leaf weighs as much as a whole sibling subtree. Computed bottom-up, one pass per tree level.

    Args:
        parent: [Nn] long, -1 at roots. depth: [Nn] long. reward: [Nn], read at leaves only.

    Returns:
        [Nn] values, floating (reward's dtype if floating, else the default dtype). A node whose children
        all have the same value has exactly that value.

    Raises:
        ValueError: arrays of different shapes, a parent out of range, depths that do not follow the
            parents, or a root without children.
    """
    check_tree(parent, depth)
    if reward.shape != parent.shape:
        raise ValueError(
            f"reward must have the shape of parent {tuple(parent.shape)}, got {tuple(reward.shape)}"
        )
    values = float_values(reward).clone()
    n_nodes = parent.numel()
    max_depth = int(depth.max()) if n_nodes else 0
    for level in range(max_depth - 1, -1, -1):  # children at level + 1 are final when level is reached
        children = (depth == level + 1).nonzero().squeeze(1)
        mean, count = segment_mean(values[children], parent[children], n_nodes)
        values = torch.where(count > 0, mean, values)
    return values


def spo_tree_advantages(
    parent: Tensor, depth: Tensor, reward: Tensor, *, adv: SpoAdv = "diff", eps: float = 1e-6
) -> Tensor:
    """SPO-tree edge advantages (BASELINES.md §SPO-tree 4): A(n) = V(n) − V(parent(n)), 0 at roots.

    Args:
        parent, depth, reward: the node arrays, as `spo_tree_values`.
        adv: "diff" (SPO's default) or "sibling_std": divide by σ + eps, σ the population std of V over n's
            siblings (n included) — SPO's code (`np.std` of the child rewards). σ is taken about V(parent),
            which is the siblings' mean.
        eps: added to σ before dividing.

    Returns:
        [Nn]. Exactly 0 at roots, for an only child (V(parent) = V(n)) and wherever all siblings have the same
        value (σ = 0 there, and so is the numerator): such rows carry no signal and are dropped (§SPO-tree 5).
    """
    if adv not in ("diff", "sibling_std"):
        raise ValueError(f"adv must be 'diff' or 'sibling_std', got {adv!r}")
    values = spo_tree_values(parent, depth, reward)
    non_root = parent >= 0
    up = parent.clamp_min(0)
    diff = torch.where(non_root, values - values[up], 0)
    if adv == "diff":
        return diff
    n_nodes = parent.numel()
    count = torch.bincount(parent[non_root], minlength=n_nodes).clamp_min(1).to(values.dtype)
    square_sum = values.new_zeros(n_nodes).index_add(0, parent[non_root], diff[non_root].square())
    sibling_std = (square_sum / count).sqrt()
    return torch.where(non_root, diff / (sibling_std[up] + eps), 0)


def spo_prob_mask(old_logp: Tensor, mask: Tensor, *, threshold: float = 0.9) -> Tensor:
    """SPO's probability mask (BASELINES.md §SPO-tree 6): a token enters the loss only if p_old < threshold.

    Args:
        old_logp: [R, T] log-probability of each sampled token under the sampling policy AT THE SAMPLING
            TEMPERATURE (logits / T before the softmax), i.e. the old log-probs of the PPO ratio.
        mask: [R, T] bool, the response tokens.
        threshold: the config's `prob_mask`, in (0, 1]; 1.0 turns the mask off: every token is kept, even one
            whose probability rounds to exactly 1.

    Returns:
        [R, T] bool, a subset of `mask`.
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    mask = mask.to(torch.bool)
    if threshold == 1:
        return mask.clone()
    return mask & (old_logp.exp() < threshold)


def spo_token_advantages(
    edge_adv: Tensor, mask: Tensor, old_logp: Tensor, *, prob_mask: float = 0.9
) -> tuple[Tensor, Tensor]:
    """Token advantages and loss mask of SPO-tree's training rows (BASELINES.md §SPO-tree 5–7).

    Row r is one tree edge (non-root node n); every token of n's segment has A(n). Rows with A(n) = 0 leave
    the loss (as if dropped from the batch: passing only the other rows gives the same result), the
    probability mask removes confident tokens, and the advantages are whitened over the tokens that remain,
    across the whole batch (mean 0, Bessel std 1; all zeros without spread), with `masked_whiten` of
    probepo.algo.advantage, the one the VinePPO baseline uses.

    Args:
        edge_adv: [R] A(n) of each row. mask: [R, T] bool response tokens. old_logp: [R, T] at the sampling
            temperature. prob_mask: the threshold of `spo_prob_mask` (1.0 = off).

    Returns:
        (adv [R, T], 0 outside the loss mask; loss_mask [R, T] bool).
    """
    if edge_adv.dim() != 1 or mask.dim() != 2 or edge_adv.shape[0] != mask.shape[0]:
        raise ValueError(
            f"edge_adv must be [R] for mask [R, T], got {tuple(edge_adv.shape)} and {tuple(mask.shape)}"
        )
    loss_mask = spo_prob_mask(old_logp, mask, threshold=prob_mask) & (edge_adv != 0)[:, None]
    adv = masked_whiten(float_values(edge_adv)[:, None].expand(mask.shape), loss_mask)
    return adv, loss_mask


def spo_children(depth: Tensor, stopped: Tensor, branching: Sequence[int]) -> Tensor:
    """SPO-tree's sampling plan (BASELINES.md §SPO-tree 1–2): how many children each node gets.

    A root gets b_1 children; a node at level ℓ (1 ≤ ℓ < len(branching)) whose segment was cut at M tokens
    gets b_{ℓ+1}; a node that stopped (EOS, answer, or the response length limit) or lies at the last level
    is a leaf and gets none. The next level's parents are `torch.arange(Nn).repeat_interleave(counts)`.

    Args:
        depth: [Nn] long, ≤ len(branching). stopped: [Nn] bool, False at roots.
        branching: (b_1, ..., b_depth), each ≥ 1 (study: 6, 6, 6).

    Returns:
        [Nn] long child counts.
    """
    if not branching or min(branching) < 1:
        raise ValueError(f"branching must be a non-empty sequence of counts >= 1, got {list(branching)}")
    if depth.shape != stopped.shape:
        raise ValueError(
            f"depth and stopped must have one shape, got {tuple(depth.shape)} and {tuple(stopped.shape)}"
        )
    if ((depth < 0) | (depth > len(branching))).any():
        raise ValueError(f"depth must lie in [0, {len(branching)}] (the tree's depth), got {depth.tolist()}")
    stopped = stopped.to(torch.bool)
    if (stopped & (depth == 0)).any():
        raise ValueError("stopped must be False at roots (depth 0): the prompt always branches")
    per_level = torch.tensor([*branching, 0], dtype=torch.long, device=depth.device)
    return torch.where(stopped, 0, per_level[depth])
