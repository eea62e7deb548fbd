"""Teacher-forced forward passes over prompt + response sequences (shared by scoring, PPO and SFT)."""

from __future__ import annotations

import torch
from torch import Tensor

from probepo.models.gpt import GPT


def pack_responses(
    prompts: list[list[int]], responses: list[list[int]]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Each prompt + response as one right-padded row (causal attention never sees the pad).

    Returns (ids [N, W], at [N, T], targets [N, T], mask [N, T] bool), T the longest response (at least 1):
    response token t of row i is targets[i, t] and is predicted at position at[i, t]; mask is False past
    the response's end.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts for {len(responses)} responses")
    if any(not p for p in prompts):
        raise ValueError("every prompt holds at least one token (BOS)")
    width = max(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
    prompt_len = torch.tensor([len(p) for p in prompts])
    response_len = torch.tensor([len(r) for r in responses])
    T = max(int(response_len.max()), 1)
    # response token t of row i sits at index len(p_i) + t and is predicted at index len(p_i) + t − 1
    at = (prompt_len[:, None] - 1 + torch.arange(T)[None, :]).clamp(max=width - 1)
    targets = ids.gather(1, (at + 1).clamp(max=width - 1))
    mask = torch.arange(T)[None, :] < response_len[:, None]
    return ids, at, targets, mask


def response_logits(
    model: GPT, prompts: list[list[int]], responses: list[list[int]]
) -> tuple[Tensor, Tensor, Tensor]:
    """One forward pass over each prompt + response (`pack_responses`).

    Returns (logits [N, T, V], targets [N, T], mask [N, T] bool): logits[i, t] is the model's prediction
    of response token t of row i, targets[i, t] that token; mask is False past the response's end.
    """
    ids, at, targets, mask = pack_responses(prompts, responses)
    logits = model(ids)
    return logits.gather(1, at[..., None].expand(-1, -1, logits.shape[-1])), targets, mask


def token_logp_entropy(logits: Tensor, targets: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    """Log-probs of targets and full-vocabulary entropies, both [N, T], of softmax(logits / temperature)."""
    logp_all = torch.log_softmax(logits / temperature, dim=-1)
    logp = logp_all.gather(-1, targets[..., None])[..., 0]
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy
