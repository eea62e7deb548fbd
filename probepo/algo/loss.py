"""Policy loss (ALGORITHM.md §5): PPO-clip per token, three aggregation modes, and the k3 KL estimator.

Shapes: N sequences, T token positions; `mask[i, t]` marks the tokens that count.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = ["kl_k3", "ppo_clip_loss"]

LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def ppo_clip_loss(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    agg: LossAgg = "token-mean",
    logratio_clamp: float = 20.0,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    norm_len: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO-clip loss: per token −min(r·A, clip(r, 1 − clip_low, 1 + clip_high)·A), r = exp(logp − old_logp).

    Args:
        logp: [N, T] log-probabilities of the taken tokens under the current policy (carries the gradient).
        old_logp: [N, T] the same under the policy that sampled them.
        adv: [N, T] token advantages, or [N] (one per sequence, broadcast over its tokens).
        mask: [N, T] bool.
        clip_low, clip_high: ε_lo, ε_hi.
        agg: "token-mean": Σ token losses / token count. "seq-mean-token-mean": mean over sequences of
            each sequence's token mean. "seq-mean-token-sum-norm" (Dr.GRPO): mean over sequences of each
            sequence's token sum / `norm_len`.
        logratio_clamp: |logp − old_logp| is clamped to this before exponentiating.
        global_tokens: token-mean divisor when the batch is one micro-batch of a larger one (the token count
            across ranks and accumulation steps), so that the micro-batch losses sum to the full mean.
            Default: this batch's token count.
        global_seqs: likewise the sequence count of the seq-mean modes. Default: this batch's sequences
            with at least one token.
        norm_len: the constant of "seq-mean-token-sum-norm". Default: T = mask.shape[1].

    Returns:
        (loss, metrics): loss a 0-d tensor; metrics python floats over valid tokens (one device sync):
        clip_fraction (tokens where clipping zeroes the gradient: A > 0 and r > 1 + ε_hi, or A < 0 and
        r < 1 − ε_lo), approx_kl (k3 estimate of KL(old ‖ new): r − 1 − log r), ratio_mean, ratio_max.
    """
    mask = mask.to(torch.bool)
    adv = adv[:, None] if adv.dim() == 1 else adv
    log_ratio = (logp - old_logp).clamp(-logratio_clamp, logratio_clamp)
    ratio = log_ratio.exp()
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high) * adv
    token_loss = torch.where(mask, -torch.minimum(unclipped, clipped), 0)

    if agg == "token-mean":
        n_tokens = global_tokens if global_tokens is not None else mask.sum().clamp_min(1)
        loss = token_loss.sum() / n_tokens
    elif agg in ("seq-mean-token-mean", "seq-mean-token-sum-norm"):
        seq_tokens = mask.sum(dim=1)
        if agg == "seq-mean-token-mean":
            seq_loss = token_loss.sum(dim=1) / seq_tokens.clamp_min(1)
        else:
            seq_loss = token_loss.sum(dim=1) / (norm_len if norm_len is not None else mask.shape[1])
        n_seqs = global_seqs if global_seqs is not None else (seq_tokens > 0).sum().clamp_min(1)
        loss = seq_loss.sum() / n_seqs
    else:
        raise ValueError(f"unknown agg {agg!r}")

    with torch.no_grad():
        adv_tokens = adv.expand_as(mask)
        clip_active = ((adv_tokens > 0) & (ratio > 1 + clip_high)) | (
            (adv_tokens < 0) & (ratio < 1 - clip_low)
        )
        n_valid = mask.sum().clamp_min(1)
        stats = torch.stack(
            [
                (clip_active & mask).sum() / n_valid,
                torch.where(mask, ratio - 1 - log_ratio, 0).sum() / n_valid,
                torch.where(mask, ratio, 0).sum() / n_valid,
                torch.where(mask, ratio, 0).max(),  # ratios are > 0: an empty mask gives 0
            ]
        ).tolist()
    metrics = dict(zip(("clip_fraction", "approx_kl", "ratio_mean", "ratio_max"), stats, strict=True))
    return loss, metrics


def kl_k3(logp: Tensor, ref_logp: Tensor, mask: Tensor, *, logratio_clamp: float = 20.0) -> Tensor:
    """Per-token k3 estimate of KL(π ‖ π_ref) on tokens sampled from π: e^d − 1 − d, d = ref_logp − logp.

    Non-negative and unbiased (Schulman's k3; verl's "low_var_kl"); d is clamped to ±logratio_clamp.

    Args:
        logp: [N, T] log-probabilities under the current policy (carries the gradient).
        ref_logp: [N, T] under the reference policy.
        mask: [N, T] bool.

    Returns:
        [N, T], 0 at masked positions. The caller aggregates it like the policy loss.
    """
    log_ratio = (ref_logp - logp).clamp(-logratio_clamp, logratio_clamp)
    return torch.where(mask.to(torch.bool), log_ratio.exp() - 1 - log_ratio, 0)
