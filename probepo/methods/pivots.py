"""Pivot rules: where a method starts its probes (ALGORITHM.md §2, §6), reward-free.

Each rule is pure: (the algo config, update k's inputs, the select stage's seed) -> [N, M] long pivot
positions (-1 = none); the select stage commits them and the probe stage continues each pivot's prefix.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from probepo.algo.advantage import group_stats
from probepo.algo.pivots import random_pivots, select_pivots, step_candidates, window_max
from probepo.config.algo import AlgoConfig
from probepo.methods.inputs import Rollouts, UpdateInputs

PivotRule = Callable[[AlgoConfig, UpdateInputs, int], Tensor]
"""(the run's algo config, update k's inputs, the select stage's seed) -> [N, M] long pivot positions,
-1 = none."""


def no_pivots(algo: AlgoConfig, inputs: UpdateInputs, seed: int) -> Tensor:
    """No probes: [N, 0]."""
    return torch.full((len(inputs.rollouts.responses), 0), -1, dtype=torch.long)


def budgeted_pivots(algo: AlgoConfig, inputs: UpdateInputs, seed: int) -> Tensor:
    """ProbePO's: up to `max_pivots` step boundaries per group ranked by windowed entropy (or placed at
    random, the ablation, drawn from `seed`), in groups with at least one finished response (§2)."""
    if algo.max_pivots == 0:
        return no_pivots(algo, inputs, seed)
    rollouts = inputs.rollouts
    mask = rollouts.mask
    eligible = eligible_rows(rollouts, algo.probe_uniform_groups)
    if algo.selector == "random":
        generator = torch.Generator().manual_seed(seed)
        chosen = random_pivots(mask, rollouts.group, max_pivots=algo.max_pivots, generator=generator)
        return torch.where(eligible[:, None], chosen, -1)
    score = window_max(inputs.scores["entropy"], mask, window=algo.entropy_window)
    candidates = step_candidates(inputs.step_end, mask, margin=algo.margin) & eligible[:, None]
    return select_pivots(
        score, candidates, rollouts.group, max_pivots=algo.max_pivots, min_spacing=algo.min_spacing
    )


def every_boundary(algo: AlgoConfig, inputs: UpdateInputs, seed: int) -> Tensor:
    """VinePPO's: every step boundary of every response (§6); no group is skipped."""
    return all_positions(step_candidates(inputs.step_end, inputs.rollouts.mask, margin=0))


def eligible_rows(rollouts: Rollouts, probe_uniform_groups: bool) -> Tensor:
    """[N] bool: responses whose group may be probed. Groups whose responses are all unfinished are
    skipped; so are groups with all-equal rewards unless probe_uniform_groups."""
    any_finished = torch.zeros(int(rollouts.group.max()) + 1, dtype=torch.bool)
    any_finished.index_put_((rollouts.group,), rollouts.finished, accumulate=True)
    eligible = any_finished[rollouts.group]
    if not probe_uniform_groups:
        _, std = group_stats(rollouts.rewards, rollouts.group)
        eligible &= std > 0
    return eligible


def all_positions(candidates: Tensor) -> Tensor:
    """[N, M] long: every candidate position of each row, ascending, -1 padded (M = most in a row)."""
    width = int(candidates.sum(1).max()) if candidates.numel() else 0
    positions = torch.arange(candidates.shape[1]).expand_as(candidates)
    keyed = torch.where(candidates, positions, candidates.shape[1])  # non-candidates sort last
    ordered = keyed.sort(dim=1).values[:, :width]
    return torch.where(ordered < candidates.shape[1], ordered, -1)
