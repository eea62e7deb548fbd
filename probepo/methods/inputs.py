"""What a method's rules read of update k: its rollouts and what the update's earlier stages committed,
behind one protocol the stages provide (probepo.stages.common.StageInputs reads each file of the store
when a rule first asks for it), so the rules stay pure functions of tensors and the algo config."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

if TYPE_CHECKING:
    from probepo.data import Problem


@dataclass
class Rollouts:
    """The backbone responses of one update, as committed by the sample stage (N = P·G rows)."""

    group: Tensor
    """[N] long: the prompt (group) of each response."""
    prompts: list[list[int]]
    responses: list[list[int]]
    rewards: Tensor
    """[N] float64."""
    finished: Tensor
    """[N] bool: the response ended with the stop token (not cut at max_tokens)."""
    problems: list[Problem]
    """The problem each response answers (for grading probe continuations)."""

    @cached_property
    def mask(self) -> Tensor:
        """[N, T] bool, T the longest response: response tokens, contiguous from position 0."""
        lengths = torch.tensor([len(r) for r in self.responses])
        width = int(lengths.max()) if len(lengths) else 0
        return torch.arange(width)[None, :] < lengths[:, None]


@dataclass(frozen=True)
class TrainingRows:
    """The rows an update trains on: score, advantage and optimize all work on these. Which rows they are is
    the method's (`Method.rows`): one per response, or one per tree edge for spo_tree."""

    prompts: list[list[int]]
    responses: list[list[int]]


class UpdateInputs(Protocol):
    """Update k as a rule sees it. A rule asks only for what its stage has committed by then: the select
    rule for `scores` and `step_end`, the advantage rules for `pivots`, `values`, `scores` and `tree`."""

    @property
    def rollouts(self) -> Rollouts: ...

    @property
    def step_end(self) -> Tensor:
        """[N, T] bool: the task's step-end tokens of each response (T as `rollouts.mask`)."""
        ...

    @property
    def scores(self) -> dict[str, Tensor]:
        """The score stage's `logp`, `entropy` [R, T] float and `mask` [R, T] bool over the training rows."""
        ...

    @property
    def pivots(self) -> Tensor:
        """[N, M] long: the select stage's pivot positions (-1 = none)."""
        ...

    @property
    def values(self) -> Tensor:
        """[N, M] float: the probe stage's prefix values at the pivots."""
        ...

    @property
    def tree(self) -> dict[str, Tensor]:
        """The trees (tree baselines) as [Nn] long node arrays: group, parent, depth, row (the leaf's rollout
        row, -1 elsewhere) and the node's segment as span [start, end) of rollout row span_row."""
        ...
