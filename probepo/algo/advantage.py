"""Advantages (ALGORITHM.md §1, §3, §4, §6): GRPO and RLOO per response, shrunk prefix values, and the centred
segment residual that redistributes a response's advantage across its tokens.

Shapes: N responses, T token positions (right padded; `mask[i, t]` marks the response's tokens, which run
contiguously from position 0), M pivot slots per response (`-1` = no pivot in that slot).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "group_advantages",
    "group_stats",
    "grpo_advantages",
    "masked_whiten",
    "redistribute",
    "rloo_advantages",
    "shrink_values",
    "vineppo_advantages",
]


def group_stats(rewards: Tensor, group: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and Bessel-corrected std of each response's group, broadcast back to the response.

    Args:
        rewards: [N] float, one reward per response.
        group: [N] long, any ids; responses sharing an id form a group (groups may differ in size).

    Returns:
        (mean [N], std [N]). A group of one has std 0. A group whose rewards are all equal has mean exactly
        equal to that reward and std exactly 0, so its advantages are exactly 0 (not a rounding residue).
    """
    _, index = torch.unique(group, return_inverse=True)
    n_groups = int(index.max()) + 1 if index.numel() else 0
    count = torch.bincount(index, minlength=n_groups).to(rewards.dtype)
    # Summing rewards shifted by the group minimum keeps equal rewards exactly equal to the mean.
    lowest = rewards.new_full((n_groups,), torch.inf).scatter_reduce(0, index, rewards, "amin")
    shifted = rewards - lowest[index]
    mean_shift = rewards.new_zeros(n_groups).index_add(0, index, shifted) / count
    deviation = shifted - mean_shift[index]
    sum_squares = rewards.new_zeros(n_groups).index_add(0, index, deviation * deviation)
    std = (sum_squares / (count - 1).clamp_min(1)).sqrt()
    return lowest[index] + mean_shift[index], std[index]


def group_advantages(
    rewards: Tensor, group: Tensor, *, scale: Literal["std", "none"] = "std", eps: float = 1e-6
) -> Tensor:
    """GRPO advantage of each response of a ragged batch of groups (ALGORITHM.md §1).

    Args:
        rewards: [N] float.
        group: [N] long group ids.
        scale: "std": (r - mean) / (std + eps); "none": r - mean (Dr.GRPO).
        eps: added to the std before dividing.

    Returns:
        [N]; exactly 0 for a group of one or a group whose rewards are all equal.
    """
    mean, std = group_stats(rewards, group)
    if scale == "std":
        return (rewards - mean) / (std + eps)
    if scale == "none":
        return rewards - mean
    raise ValueError(f"scale must be 'std' or 'none', got {scale!r}")


def rloo_advantages(rewards: Tensor, group: Tensor) -> Tensor:
    """RLOO advantage of each response: its reward minus the mean of the other G − 1 rewards of its group.

    Computed as G / (G − 1) · (r_i − r̄), the same quantity, so that a group whose rewards are all equal gets
    exactly 0 (r̄ is exact for it, see `group_stats`) where a sum of the others would leave a rounding residue.

    Args:
        rewards: [N] float.
        group: [N] long group ids (groups may differ in size).

    Returns:
        [N]; exactly 0 for a group of one (no other response to compare with) or of equal rewards.
    """
    mean, _ = group_stats(rewards, group)
    _, index = torch.unique(group, return_inverse=True)
    size = torch.bincount(index)[index].to(rewards.dtype)
    return torch.where(size > 1, size / (size - 1).clamp_min(1) * (rewards - mean), 0)


def grpo_advantages(rewards: Tensor, *, scale: Literal["std", "none"] = "std", eps: float = 1e-6) -> Tensor:
    """GRPO advantages of P groups of G responses each: `group_advantages` with one group per row.

    Args:
        rewards: [P, G] float.

    Returns:
        [P, G]; a row of one response, or of equal rewards, is exactly 0 (verl differs for singletons).
    """
    n_prompts, group_size = rewards.shape
    group = torch.arange(n_prompts, device=rewards.device).repeat_interleave(group_size)
    return group_advantages(rewards.reshape(-1), group, scale=scale, eps=eps).view(n_prompts, group_size)


def shrink_values(
    successes: Tensor | float, trials: Tensor | float, prior: Tensor | float, *, kappa: float = 4.0
) -> Tensor:
    """Prefix values shrunk toward a prior (ALGORITHM.md §3): V = (k + κ·prior) / (K + κ).

    Args:
        successes: k, any shape (int or float).
        trials: K, broadcastable with `successes`.
        prior: the group reward mean r̄, broadcastable.
        kappa: pseudo-count κ ≥ 0; 0 gives the plain Monte-Carlo mean k / K.

    Returns:
        The broadcast shape, floating point. Where K + κ = 0 (no trials and no pseudo-count) there is no
        evidence at all, and the value is defined as the prior rather than 0/0.
    """
    if kappa < 0:
        raise ValueError(f"kappa must be >= 0, got {kappa}")
    successes, trials, prior = (torch.as_tensor(x) for x in (successes, trials, prior))
    dtype = torch.promote_types(torch.promote_types(successes.dtype, trials.dtype), prior.dtype)
    if not dtype.is_floating_point:  # integer counts and an integer prior
        dtype = torch.get_default_dtype()
    successes, trials, prior = torch.broadcast_tensors(successes.to(dtype), trials.to(dtype), prior.to(dtype))
    weight = trials + kappa
    shrunk = (successes + kappa * prior) / torch.where(weight > 0, weight, 1)
    return torch.where(weight > 0, shrunk, prior)


def redistribute(
    seq_adv: Tensor,
    rewards: Tensor,
    baseline: Tensor,
    mask: Tensor,
    pivot_pos: Tensor,
    pivot_val: Tensor,
    *,
    weight: float = 1.0,
    scale: float | Tensor = 1.0,
) -> Tensor:
    """ProbePO token advantages: A_{i,t} = A_i + λ · c_t / scale (ALGORITHM.md §4).

    The pivots of response i split it into segments S_0 = [0, t_1), ..., S_m = [t_m, T_i) whose boundary
    values are V_0 = baseline_i, V_j = pivot value, V_{m+1} = r_i; every token of S_j gets the residual
    δ_j = V_{j+1} − V_j, centred over the response's tokens, so each response keeps its token-mean A_i.

    Args:
        seq_adv: [N] GRPO advantage A_i of each response.
        rewards: [N] reward r_i (the last boundary value).
        baseline: [N] group reward mean r̄ (the first boundary value).
        mask: [N, T] bool, response tokens, contiguous from position 0.
        pivot_pos: [N, M] long, pivot positions in 1..T_i−1 in any order, -1 = empty slot.
        pivot_val: [N, M] float, the value V̂ of each pivot's prefix (ignored in empty slots).
        weight: λ, the weight of the residual (0 gives GRPO).
        scale: float or [N] per-response divisor of the residual, > 0 (e.g. max(group std, floor)).

    Returns:
        [N, T] token advantages, 0 at padded positions. With no pivots (or λ = 0) every token of response i
        is exactly A_i.

    Raises:
        ValueError: a pivot outside 1..T_i−1, a repeated pivot, a mask not contiguous from 0, or scale ≤ 0.
    """
    scale = torch.as_tensor(scale, dtype=seq_adv.dtype, device=seq_adv.device)
    if (scale <= 0).any():
        raise ValueError("scale must be > 0")
    deltas, sizes = _segments(rewards, baseline, mask, pivot_pos, pivot_val)
    # Token mean of the residual, Σ_j δ_j |S_j| / T_i; with no pivots |S_0| / T_i is exactly 1, so the
    # centred residual below is exactly 0 and the tokens get exactly A_i.
    lengths = sizes.sum(dim=1, keepdim=True).clamp_min(1)
    residual_mean = (deltas * (sizes.to(deltas.dtype) / lengths.to(deltas.dtype))).sum(dim=1, keepdim=True)
    per_response_scale = scale[:, None] if scale.dim() == 1 else scale
    segment_adv = seq_adv[:, None] + weight * (deltas - residual_mean) / per_response_scale
    return _expand_segments(segment_adv, sizes, mask.shape[1])


def vineppo_advantages(
    rewards: Tensor, baseline: Tensor, mask: Tensor, pivot_pos: Tensor, pivot_val: Tensor
) -> Tensor:
    """VinePPO-style dense advantages (ALGORITHM.md §6): A_{i,t} = δ_{seg(t)}, whitened over the batch.

    Segments and δ as in `redistribute` (plain Monte-Carlo pivot values, no GRPO term, no centring per
    response); the advantages are then shifted and scaled to mean 0 and (Bessel) std 1 over all valid
    tokens of the batch, as verl's masked_whiten. Zero spread (or fewer than two tokens) gives all zeros.

    Args:
        rewards, baseline: [N]. mask: [N, T] bool. pivot_pos: [N, M] long (-1 = none). pivot_val: [N, M].

    Returns:
        [N, T], 0 at padded positions.
    """
    deltas, sizes = _segments(rewards, baseline, mask, pivot_pos, pivot_val)
    return masked_whiten(_expand_segments(deltas, sizes, mask.shape[1]), mask)


def _segments(
    rewards: Tensor, baseline: Tensor, mask: Tensor, pivot_pos: Tensor, pivot_val: Tensor
) -> tuple[Tensor, Tensor]:
    """δ_j [N, M + 1] and |S_j| [N, M + 1] (long) of the segments S_0..S_M of each response (§4).

    A response with m < M pivots has M − m trailing empty segments (|S_j| = 0, δ_j = 0).
    """
    lengths = _response_lengths(mask)
    _check_pivots(pivot_pos, lengths)
    dtype = torch.promote_types(torch.promote_types(rewards.dtype, baseline.dtype), pivot_val.dtype)
    rewards, baseline, pivot_val = rewards.to(dtype), baseline.to(dtype), pivot_val.to(dtype)

    present = pivot_pos >= 0
    # Empty slots move to T_i: they sort after every pivot and close empty segments whose δ is r − r = 0.
    starts, order = torch.where(present, pivot_pos, lengths[:, None]).sort(dim=1)
    values = torch.where(present, pivot_val, rewards[:, None]).gather(1, order)
    boundary_values = torch.cat([baseline[:, None], values, rewards[:, None]], dim=1)  # V_0..V_{M+1}
    edges = torch.cat([torch.zeros_like(lengths)[:, None], starts, lengths[:, None]], dim=1)
    return boundary_values.diff(dim=1), edges.diff(dim=1)


def _expand_segments(segment_values: Tensor, sizes: Tensor, n_positions: int) -> Tensor:
    """[N, T]: each segment's value repeated over its tokens (segments tile 0..T_i−1), 0 on padding."""
    n_rows = segment_values.shape[0]
    padding = n_positions - sizes.sum(dim=1, keepdim=True)
    values = torch.cat([segment_values, torch.zeros_like(segment_values[:, :1])], dim=1)
    counts = torch.cat([sizes, padding], dim=1)
    # One pass writing N·T values: each row's counts sum to T, so rows come out aligned.
    return (
        values.flatten()
        .repeat_interleave(counts.flatten(), output_size=n_rows * n_positions)
        .view(n_rows, n_positions)
    )


def _response_lengths(mask: Tensor) -> Tensor:
    """T_i [N] long, after checking that every row's tokens run contiguously from position 0."""
    starts_after_padding = mask[:, 1:] > mask[:, :-1]  # a token right after a padded position
    if starts_after_padding.any():
        row = int(starts_after_padding.any(dim=1).nonzero()[0])
        raise ValueError(f"mask row {row} is not right padded (tokens must run contiguously from position 0)")
    # int32 accumulation: about 3× faster than the default int64 on CPU.
    return mask.sum(dim=1, dtype=torch.int32).long()


def _check_pivots(pivot_pos: Tensor, lengths: Tensor) -> None:
    """Each slot is -1 or a position in 1..T_i−1, with no position repeated within a row."""
    present = pivot_pos >= 0
    outside = (pivot_pos < -1) | (present & ((pivot_pos < 1) | (pivot_pos > lengths[:, None] - 1)))
    ordered = torch.where(present, pivot_pos, -1).sort(dim=1).values
    repeated = (ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)
    bad_rows = outside.any(dim=1) | repeated.any(dim=1)
    if bad_rows.any():
        row = int(bad_rows.nonzero()[0])
        raise ValueError(
            f"pivot_pos row {row} = {pivot_pos[row].tolist()}: each slot must be -1 or a distinct position in"
            f" [1, {int(lengths[row]) - 1}] (response length {int(lengths[row])})"
        )


def masked_whiten(values: Tensor, mask: Tensor) -> Tensor:
    """Shift and scale the valid entries to mean 0 and Bessel std 1; zeros where there is no spread."""
    valid = values[mask]
    if valid.numel() < 2:
        return torch.zeros_like(values)
    # Shifting by the minimum keeps equal values exactly equal, so zero spread is detected exactly.
    lowest = valid.min()
    mean_shift = (valid - lowest).mean()
    std = (valid - lowest - mean_shift).square().sum().div(valid.numel() - 1).sqrt()
    if std == 0:
        return torch.zeros_like(values)
    return torch.where(mask, (values - lowest - mean_shift) / std, 0)
