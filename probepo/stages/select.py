"""Select: where to probe (ALGORITHM.md §2), reward-free, under the per-group budget.

grpo and the tree baselines: nowhere. probepo: step boundaries ranked by windowed entropy (or the
random-placement ablation), in groups with at least one finished response. vineppo: every step boundary of
every response.
"""

from __future__ import annotations

import torch
from torch import Tensor

from probepo.algo.advantage import group_stats
from probepo.algo.pivots import random_pivots, select_pivots, step_candidates, window_max
from probepo.config import TREE_ALGORITHMS
from probepo.stages.common import SCORES, Rollouts, read_tensors, task_of
from probepo.stages.context import StageContext
from probepo.store.formats import tensors_to_bytes

STAGE = "select"
PIVOTS = "pivots.safetensors"


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


def choose_pivots(ctx: StageContext, rollouts: Rollouts) -> Tensor:
    """[N, M] long pivot positions (-1 = none) of the update's responses under the run's algorithm."""
    algo = ctx.config.algo
    mask = rollouts.mask
    if algo.algorithm in ("grpo", *TREE_ALGORITHMS) or (algo.algorithm == "probepo" and algo.max_pivots == 0):
        return torch.full((len(rollouts.responses), 0), -1, dtype=torch.long)
    task = task_of(ctx)
    step_end = torch.zeros_like(mask)
    for row, response in enumerate(rollouts.responses):
        step_end[row, : len(response)] = torch.tensor(task.step_end(response), dtype=torch.bool)
    if algo.algorithm == "vineppo":  # every step boundary of every response (§6): no group is skipped
        return all_positions(step_candidates(step_end, mask, margin=0))
    eligible = eligible_rows(rollouts, algo.probe_uniform_groups)
    if algo.selector == "random":
        generator = torch.Generator().manual_seed(ctx.seed(STAGE))
        chosen = random_pivots(mask, rollouts.group, max_pivots=algo.max_pivots, generator=generator)
        return torch.where(eligible[:, None], chosen, -1)
    entropy = read_tensors(ctx, "score", SCORES)["entropy"]
    score = window_max(entropy, mask, window=algo.entropy_window)
    candidates = step_candidates(step_end, mask, margin=algo.margin) & eligible[:, None]
    return select_pivots(
        score, candidates, rollouts.group, max_pivots=algo.max_pivots, min_spacing=algo.min_spacing
    )


def run(ctx: StageContext) -> None:
    pivots = choose_pivots(ctx, Rollouts.read(ctx))
    count = int((pivots >= 0).sum())
    summary = {"pivots": count, "probed_responses": int((pivots >= 0).any(1).sum()) if pivots.numel() else 0}
    ctx.commit(STAGE, {PIVOTS: tensors_to_bytes({"pivot_pos": pivots.contiguous()})}, summary)
