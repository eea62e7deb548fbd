"""Pivot rules: where a method starts its probes (ALGORITHM.md §2, §6), reward-free.

Each rule maps the update's rollouts to [N, M] long pivot positions (-1 = none); the select stage commits
them and the probe stage continues each pivot's prefix.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from probepo.algo.advantage import group_stats
from probepo.algo.pivots import random_pivots, select_pivots, step_candidates, window_max
from probepo.schedule import Stage
from probepo.stages.common import SCORES, Rollouts, read_tensors, task_of
from probepo.stages.context import StageContext

PivotRule = Callable[[StageContext, Rollouts], Tensor]
"""(context of update k, its rollouts) -> [N, M] long pivot positions, -1 = none."""


def no_pivots(ctx: StageContext, rollouts: Rollouts) -> Tensor:
    """No probes: [N, 0]."""
    return torch.full((len(rollouts.responses), 0), -1, dtype=torch.long)


def budgeted_pivots(ctx: StageContext, rollouts: Rollouts) -> Tensor:
    """ProbePO's: up to `max_pivots` step boundaries per group ranked by windowed entropy (or placed at
    random, the ablation), in groups with at least one finished response (§2)."""
    algo = ctx.config.algo
    if algo.max_pivots == 0:
        return no_pivots(ctx, rollouts)
    mask = rollouts.mask
    eligible = eligible_rows(rollouts, algo.probe_uniform_groups)
    if algo.selector == "random":
        generator = torch.Generator().manual_seed(ctx.seed(Stage.SELECT))
        chosen = random_pivots(mask, rollouts.group, max_pivots=algo.max_pivots, generator=generator)
        return torch.where(eligible[:, None], chosen, -1)
    entropy = read_tensors(ctx, Stage.SCORE, SCORES)["entropy"]
    score = window_max(entropy, mask, window=algo.entropy_window)
    candidates = step_candidates(_step_ends(ctx, rollouts), mask, margin=algo.margin) & eligible[:, None]
    return select_pivots(
        score, candidates, rollouts.group, max_pivots=algo.max_pivots, min_spacing=algo.min_spacing
    )


def every_boundary(ctx: StageContext, rollouts: Rollouts) -> Tensor:
    """VinePPO's: every step boundary of every response (§6); no group is skipped."""
    return all_positions(step_candidates(_step_ends(ctx, rollouts), rollouts.mask, margin=0))


def _step_ends(ctx: StageContext, rollouts: Rollouts) -> Tensor:
    """[N, T] bool: the task's step-end tokens of each response."""
    task = task_of(ctx)
    step_end = torch.zeros_like(rollouts.mask)
    for row, response in enumerate(rollouts.responses):
        step_end[row, : len(response)] = torch.tensor(task.step_end(response), dtype=torch.bool)
    return step_end


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
