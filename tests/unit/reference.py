"""Slow, literal pure-Python versions of probepo.algo, written straight from ALGORITHM.md.

One response, one group or one token at a time, with plain floats and lists: the vectorised code must agree.
"""

from __future__ import annotations

import math


def grpo(rewards: list[float], *, scale: str = "std", eps: float = 1e-6) -> list[float]:
    """§1 for one group."""
    n = len(rewards)
    mean = sum(rewards) / n
    if n == 1 or all(r == rewards[0] for r in rewards):
        return [0.0] * n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1))
    return [(r - mean) / (std + eps) if scale == "std" else r - mean for r in rewards]


def rloo(rewards: list[float]) -> list[float]:
    """RLOO for one group: each reward minus the mean of the others (0 for a group of one)."""
    n = len(rewards)
    if n == 1:
        return [0.0]
    return [r - (sum(rewards) - r) / (n - 1) for r in rewards]


def window_max(entropy: list[float], length: int, window: int) -> list[float]:
    """§2.3 for one response: max over [t, t + W) ∩ [0, T_i), -inf past the end."""
    out = [-math.inf] * len(entropy)
    for t in range(length):
        out[t] = max(entropy[u] for u in range(t, min(t + window, length)))
    return out


def step_candidates(step_end: list[bool], length: int, margin: int) -> list[bool]:
    """§2.2 for one response."""
    return [
        t >= 1 and step_end[t - 1] and margin <= t <= length - margin and t <= length - 1
        for t in range(len(step_end))
    ]


def select_pivots(
    score: list[list[float]],
    candidates: list[list[bool]],
    group: list[int],
    max_pivots: int,
    min_spacing: int,
) -> list[list[int]]:
    """§2.4: per group, repeatedly take the best remaining (score, then lowest row, then lowest t)."""
    picks: list[list[int]] = [[] for _ in score]
    for g in set(group):
        remaining = [
            (i, t)
            for i in range(len(score))
            if group[i] == g
            for t in range(len(score[i]))
            if candidates[i][t]
        ]
        for _ in range(max_pivots):
            if not remaining:
                break
            i, t = min(remaining, key=lambda it: (-score[it[0]][it[1]], it[0], it[1]))
            picks[i].append(t)
            remaining = [(j, u) for j, u in remaining if j != i or abs(u - t) >= min_spacing]
    return [sorted(p) for p in picks]


def segment_residual(
    reward: float, baseline: float, length: int, pivots: list[tuple[int, float]]
) -> list[float]:
    """§4: ρ_t = δ_{seg(t)} for one response; pivots as (position, value) in any order."""
    pivots = sorted(pivots)
    values = [baseline] + [v for _, v in pivots] + [reward]
    starts = [0] + [t for t, _ in pivots] + [length]
    residual = []
    for j in range(len(pivots) + 1):
        delta = values[j + 1] - values[j]
        residual += [delta] * (starts[j + 1] - starts[j])
    return residual


def redistribute(
    seq_adv: float,
    reward: float,
    baseline: float,
    length: int,
    pivots: list[tuple[int, float]],
    *,
    weight: float,
    scale: float,
) -> list[float]:
    """§4: A_t = A_i + λ (ρ_t − mean ρ) / scale for one response (its T_i tokens only)."""
    residual = segment_residual(reward, baseline, length, pivots)
    mean = sum(residual) / length
    return [seq_adv + weight * (rho - mean) / scale for rho in residual]


def vineppo(
    rewards: list[float], baselines: list[float], lengths: list[int], pivots: list[list[tuple[int, float]]]
) -> list[list[float]]:
    """§6: ρ per token, whitened over all tokens of the batch (Bessel std); zeros without spread."""
    residuals = [segment_residual(*args) for args in zip(rewards, baselines, lengths, pivots, strict=True)]
    flat = [x for row in residuals for x in row]
    mean = sum(flat) / len(flat)
    std = math.sqrt(sum((x - mean) ** 2 for x in flat) / (len(flat) - 1))
    return [[(x - mean) / std if std > 0 else 0.0 for x in row] for row in residuals]
