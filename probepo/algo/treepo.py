"""TreePO (BASELINES.md §TreePO): trajectory advantages from nested subgroups of a tree's leaves, their batch
normalisation over response tokens, and the sampler's branching and fallback rules. Leaf paths as in
probepo.algo.tree (`leaf_ancestors`)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from probepo.algo.tree import float_values, segment_mean

__all__ = ["treepo_advantages", "treepo_children", "treepo_normalize", "treepo_restarts"]

TreepoAgg = Literal["mean", "size_weighted"]


def treepo_advantages(ancestors: Tensor, reward: Tensor, *, agg: TreepoAgg = "mean") -> Tensor:
    """TreePO trajectory advantages Ã_i from nested subgroups (BASELINES.md §TreePO 5–6).

    Leaf i's subgroups are G_j = the leaves sharing its first j segments (G_0: all leaves of its prompt), for
    every j with |G_j| > 1, identical member sets counted once: G_j is counted at the deepest j giving that
    set, i.e. where |G_j| > |G_{j+1}| (G_{j+1} ⊆ G_j, so equal sizes mean equal sets; a single-child chain
    repeats its set). Â_ij = r_i − mean(r over G_j); Ã_i = mean over i's subgroups of Â_ij ("mean") or
    Σ|G_j|Â_ij / Σ|G_j| ("size_weighted").

    Args:
        ancestors: [L, D + 1] long leaf paths (module docstring): column 0 present in every row, -1 only after
            a row's last label.
        reward: [L] leaf rewards.
        agg: "mean" (default) or "size_weighted".

    Returns:
        [L], before normalisation. A leaf with no subgroup (its prompt's only leaf) gets exactly 0 (the
        released code would keep r_i, the size-1 G_0 being always counted there). A subgroup of equal rewards
        contributes exactly 0.

    Raises:
        ValueError: bad shapes, a -1 in column 0 or before a label, prefixes whose shorter prefixes differ
            (not a tree), or a leaf path shared by another leaf (a repeated leaf, or a leaf on the path of
            another).
    """
    if agg not in ("mean", "size_weighted"):
        raise ValueError(f"agg must be 'mean' or 'size_weighted', got {agg!r}")
    if ancestors.dim() != 2 or ancestors.shape[1] == 0 or reward.shape != ancestors.shape[:1]:
        raise ValueError(
            "ancestors must be [L, D + 1] (D + 1 >= 1) and reward [L],"
            f" got {tuple(ancestors.shape)} and {tuple(reward.shape)}"
        )
    n_leaves, n_columns = ancestors.shape
    present = ancestors >= 0
    after_gap = present[:, 1:] & ~present[:, :-1]
    bad_rows = (ancestors < -1).any(dim=1) | after_gap.any(dim=1) | ~present[:, 0]
    if bad_rows.any():
        row = int(bad_rows.nonzero()[0])
        raise ValueError(
            f"ancestors row {row} = {ancestors[row].tolist()}: labels >= 0 from column 0, then only -1"
        )

    rewards = float_values(reward)
    sizes = torch.zeros(n_leaves, n_columns + 1, dtype=torch.long, device=ancestors.device)
    means = rewards.new_zeros(n_leaves, n_columns)
    for column in range(n_columns):  # one pass per tree level
        rows = present[:, column].nonzero().squeeze(1)
        labels, group = torch.unique(ancestors[rows, column], return_inverse=True)
        if column > 0:
            _check_nested(ancestors[rows, column - 1], group, labels.numel(), column)
        mean, count = segment_mean(rewards[rows], group, labels.numel())
        sizes[rows, column] = count[group]
        means[rows, column] = mean[group]

    last = present.sum(dim=1) - 1
    shared = sizes[torch.arange(n_leaves, device=ancestors.device), last] != 1
    if shared.any():
        row = int(shared.nonzero()[0])
        raise ValueError(
            f"ancestors row {row} = {ancestors[row].tolist()}: another leaf has the same path or runs"
            " through this one"
        )
    counted = (sizes[:, :-1] > 1) & (sizes[:, :-1] > sizes[:, 1:])
    weight = sizes[:, :-1] if agg == "size_weighted" else torch.ones_like(sizes[:, :-1])
    weight = torch.where(counted, weight, 0).to(rewards.dtype)
    total = weight.sum(dim=1)
    weighted = (weight * (rewards[:, None] - means)).sum(dim=1)
    return torch.where(total > 0, weighted / torch.where(total > 0, total, 1), 0)


def _check_nested(previous: Tensor, group: Tensor, n_groups: int, column: int) -> None:
    """Leaves sharing a column-`column` label must share their column-(column − 1) label (a tree)."""
    lowest = previous.new_full((n_groups,), torch.iinfo(previous.dtype).max).scatter_reduce(
        0, group, previous, "amin"
    )
    highest = previous.new_full((n_groups,), -1).scatter_reduce(0, group, previous, "amax")
    if (lowest != highest).any():
        raise ValueError(
            f"ancestors column {column}: leaves sharing a label there have different labels in column"
            f" {column - 1} (a prefix must extend a single shorter prefix)"
        )


def treepo_normalize(leaf_adv: Tensor, n_tokens: Tensor, *, center: bool = True) -> Tensor:
    """TreePO's batch normalisation (BASELINES.md §TreePO 7): A_i = (Ã_i − μ) / σ over response tokens.

    μ and σ run over all response tokens of the update's batch, each leaf's Ã_i repeated over its n_i tokens
    (a token-weighted mean and Bessel std over the N = Σ n_i tokens, as verl's masked_whiten in the released
    code). `center=False` is the paper's variant: A_i = Ã_i / σ (σ still taken about μ).

    Args:
        leaf_adv: [L] Ã_i. n_tokens: [L] long ≥ 0, response tokens of each leaf row.
        center: subtract μ (the released code, default) or not (the paper).

    Returns:
        [L]; all zeros when the tokens have no spread (σ = 0) or there are fewer than two tokens.
    """
    if n_tokens.shape != leaf_adv.shape or leaf_adv.dim() != 1:
        raise ValueError(
            f"leaf_adv and n_tokens must be [L], got {tuple(leaf_adv.shape)} and {tuple(n_tokens.shape)}"
        )
    if (n_tokens < 0).any():
        raise ValueError(f"n_tokens must be >= 0, got {n_tokens.tolist()}")
    values = float_values(leaf_adv)
    weight = n_tokens.to(values.dtype)
    total = weight.sum()
    if total < 2:
        return torch.zeros_like(values)
    # Shifting by the minimum over tokens keeps equal values exactly equal, so zero spread is exact.
    shifted = values - values[n_tokens > 0].min()
    mean_shift = (weight * shifted).sum() / total
    std = (weight * (shifted - mean_shift).square()).sum().div(total - 1).sqrt()
    if std == 0:
        return torch.zeros_like(values)
    return (shifted - mean_shift) / std if center else values / std


def treepo_children(
    active: Tensor, finished_now: Tensor, finished_total: Tensor, width: int, *, fork: int = 2
) -> Tensor:
    """TreePO's branching rule after a step (BASELINES.md §TreePO 3), for every prompt at once.

    With A active paths, F paths finished this step and W finished so far (F included), the prompt's
    children total B = max(A, min(w − W, fork·F + fork·A)), split over its active paths in order: ⌊B/A⌋
    each, the remainder B mod A to the last; B ≥ A gives every path at least 1. With w = 16 and no early
    finishes: 2 → 4 → 8 → 16 paths, then chains of one child each.

    Args:
        active: [P] long A per prompt. finished_now: [P] F. finished_total: [P] W (≥ F).
        width: w, the target leaves per prompt (study: 16); A + W ≤ w must hold (every path ends as a leaf).
        fork: the released code's fixed_step_width (2 in BASELINES).

    Returns:
        [Σ A] long: the children of each active path, prompt 0's paths first; a prompt with A = 0 has none
        (it falls back to `treepo_restarts` if W < w).
    """
    if width < 1 or fork < 1:
        raise ValueError(f"width and fork must be >= 1, got width={width}, fork={fork}")
    if not (active.dim() == 1 and finished_now.shape == active.shape == finished_total.shape):
        raise ValueError(
            "active, finished_now and finished_total must be [P] each, got"
            f" {tuple(active.shape)}, {tuple(finished_now.shape)}, {tuple(finished_total.shape)}"
        )
    active, finished_now, finished_total = active.long(), finished_now.long(), finished_total.long()
    bad = (
        (active < 0)
        | (finished_now < 0)
        | (finished_now > finished_total)
        | (active + finished_total > width)
    )
    if bad.any():
        p = int(bad.nonzero()[0])
        raise ValueError(
            f"prompt {p}: active={int(active[p])}, finished_now={int(finished_now[p])},"
            f" finished_total={int(finished_total[p])} must satisfy 0 <= finished_now <= finished_total and"
            f" 0 <= active, active + finished_total <= width={width}"
        )
    total = torch.maximum(active, torch.minimum(width - finished_total, fork * (finished_now + active)))
    divisor = active.clamp_min(1)
    path_prompt = torch.arange(active.numel(), device=active.device).repeat_interleave(active)
    first_path = torch.cumsum(active, 0) - active
    position = torch.arange(path_prompt.numel(), device=active.device) - first_path[path_prompt]
    is_last = position == active[path_prompt] - 1
    return (total // divisor)[path_prompt] + torch.where(is_last, (total % divisor)[path_prompt], 0)


def treepo_restarts(
    n_segments: Tensor, prompt: Tensor, budget: Tensor, generator: torch.Generator, *, fork: int = 2
) -> tuple[Tensor, Tensor, Tensor]:
    """TreePO's fallback (BASELINES.md §TreePO 4): where a prompt with no active path restarts sampling.

    Semantics (the released code's "random" fallback): candidate k, a finished path of s_k segments, is cut
    at a uniformly random segment boundary c_k ∈ {0, ..., s_k − 1} (c_k segments kept; 0 = from the prompt;
    never s_k, the finished end). One pass over each prompt's candidates in the order given: each gets
    min(fork, budget left) copies of its cut prefix, the copies sharing c_k, until the budget is used or the
    candidates run out (what is left is spent by the branching rule at the next step, as the restarts are
    active then). A prompt with budget but no candidate restarts min(fork, budget) copies from the prompt,
    as its first step did. One uniform draw per candidate, in the order given, used or not.

    Args:
        n_segments: [C] long ≥ 1, segments of each candidate (finished path).
        prompt: [C] long, each candidate's prompt in [0, P).
        budget: [P] long ≥ 0: w − W for a prompt with no active path and fewer than w leaves, 0 otherwise.
        generator: the torch.Generator (CPU) the cuts are drawn from.
        fork: copies per candidate (2 in BASELINES).

    Returns:
        (prompt [R], source [R]: candidate index, -1 = the prompt; cut [R]: segments kept), one row per
        restarted path, grouped by prompt in ascending order, candidates in the order given.
    """
    if fork < 1:
        raise ValueError(f"fork must be >= 1, got {fork}")
    if n_segments.dim() != 1 or prompt.shape != n_segments.shape or budget.dim() != 1:
        raise ValueError(
            f"n_segments and prompt must be [C] and budget [P], got {tuple(n_segments.shape)},"
            f" {tuple(prompt.shape)}, {tuple(budget.shape)}"
        )
    n_prompts, n_candidates = budget.numel(), n_segments.numel()
    if (n_segments < 1).any():
        raise ValueError(
            f"n_segments must be >= 1 (a finished path has a segment), got {n_segments.tolist()}"
        )
    if ((prompt < 0) | (prompt >= n_prompts)).any():
        raise ValueError(f"prompt must lie in [0, {n_prompts}), got {prompt.tolist()}")
    if (budget < 0).any():
        raise ValueError(f"budget must be >= 0, got {budget.tolist()}")
    device = n_segments.device
    n_segments, prompt, budget = n_segments.long(), prompt.long(), budget.long()

    uniform = torch.rand(n_candidates, generator=generator, dtype=torch.float64).to(device)
    cut = (uniform * n_segments).long().clamp_max(n_segments - 1)
    order = torch.argsort(prompt, stable=True)
    per_prompt = torch.bincount(prompt, minlength=n_prompts)
    rank = torch.empty_like(prompt)
    rank[order] = (
        torch.arange(n_candidates, device=device) - (torch.cumsum(per_prompt, 0) - per_prompt)[prompt[order]]
    )
    copies = (budget[prompt] - fork * rank).clamp(0, fork)
    from_prompt = torch.where(per_prompt > 0, 0, budget.clamp_max(fork))

    # Candidates first, then one prompt entry per prompt; a stable sort by prompt keeps the given order.
    row_prompt = torch.cat([prompt, torch.arange(n_prompts, device=device)])
    source = torch.cat([torch.arange(n_candidates, device=device), torch.full_like(budget, -1)])
    row_cut = torch.cat([cut, torch.zeros_like(budget)])
    counts = torch.cat([copies, from_prompt])
    order = torch.argsort(row_prompt, stable=True)
    counts = counts[order]
    return (
        row_prompt[order].repeat_interleave(counts),
        source[order].repeat_interleave(counts),
        row_cut[order].repeat_interleave(counts),
    )
