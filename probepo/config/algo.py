"""The maths of an update: the algorithm and its fields (ALGORITHM.md; the tree baselines: BASELINES.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import Field, model_validator

from probepo.config.base import Strict as _Strict

Algorithm = Literal["grpo", "probepo", "vineppo", "rloo", "spo_tree", "treepo"]
"""The names of probepo.methods.METHODS, one per method (a test keeps the two equal); the checks of a
method's fields are METHOD_CHECKS below."""


class AlgoConfig(_Strict):
    """The maths of one update (ALGORITHM.md): advantages, pivot selection, probing, redistribution, loss.

    Defaults are the study's headline recipe; fields marked *choice* are left open by the study.
    """

    algorithm: Algorithm = "probepo"
    """grpo: one group-normalised advantage per response. probepo: sparse probes redistribute it across
    tokens. vineppo: every step boundary probed, plain Monte-Carlo values, no GRPO term (§6). rloo: the
    reward minus the mean of the group's other rewards. spo_tree and treepo: the tree baselines
    (BASELINES.md): a tree of responses per prompt instead of G independent ones, every sampled token
    trained on, no probes (their fields are the `spo_` and `treepo_` ones)."""

    advantage_scale: Literal["std", "none"] = "std"
    """GRPO normalisation: `std` divides by the Bessel-corrected group std (+eps); `none` is Dr.GRPO."""

    advantage_eps: float = Field(1e-6, gt=0)
    """ε added to the group std before dividing."""

    selector: Literal["entropy", "random"] = "entropy"
    """Pivot placement: `entropy` ranks step boundaries by windowed entropy; `random` is the ablation
    (uniform interior positions, no boundary or spacing rules, same budget)."""

    entropy_window: int = Field(8, ge=1)
    """W: a candidate's score is the max token entropy over [t, t+W) on the generated trajectory."""

    margin: int = Field(8, ge=0)
    """*choice*: candidates lie at least this many tokens from the response's start and end."""

    max_pivots: int = Field(5, ge=0)
    """At most this many pivots per group (0 recovers GRPO)."""

    continuations_per_pivot: int = Field(8, ge=1)
    """K: continuations sampled from each pivot's prefix."""

    probe_budget: int = Field(40, ge=0)
    """Cap on auxiliary continuations per group; max_pivots × continuations_per_pivot must fit in it."""

    min_spacing: int = Field(16, ge=1)
    """*choice*: pivots in the same response are at least this many tokens apart."""

    kappa: float = Field(4.0, ge=0)
    """κ: pseudo-count shrinking a prefix value toward the group reward mean (0 is the shrinkage ablation)."""

    residual_weight: float = Field(1.0, ge=0)
    """λ: weight of the centred segment residual (0 gives GRPO)."""

    residual_scale: Literal["reward", "group_std"] = "reward"
    """*choice*: divide the residual by 1 (`reward`) or by max(group std, residual_std_floor)."""

    residual_std_floor: float = Field(0.1, gt=0)
    """Floor of the group std when residual_scale is `group_std`."""

    probe_uniform_groups: bool = True
    """*choice*: probe groups whose rewards are all equal (GRPO gives them zero signal)."""

    rescue_suffix: str = "\n\nFinal answer: \\boxed{"
    """*choice*: appended to a probe continuation cut off at the length limit before a greedy rescue."""

    rescue_tokens: int = Field(32, ge=0)
    """*choice*: greedy tokens generated after the rescue suffix (0 disables cutoff rescue)."""

    clip_low: float = Field(0.2, ge=0, lt=1)
    """PPO ε_lo: the ratio is clipped below at 1 − clip_low."""

    clip_high: float = Field(0.2, ge=0)
    """PPO ε_hi: the ratio is clipped above at 1 + clip_high."""

    logratio_clamp: float = Field(20.0, gt=0)
    """|log ratio| is clamped to this before exponentiating (numerical safety)."""

    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    """How token losses are aggregated: over all tokens (global count), per sequence then over sequences,
    or Dr.GRPO's per-sequence sum divided by a constant length."""

    kl_coef: float = Field(0.0, ge=0)
    """Coefficient of the k3 KL penalty to the reference policy (0: no reference pass)."""

    spo_branching: tuple[int, ...] = Field((6, 6, 6), min_length=1, max_length=8)
    """spo_tree: children of each node by level, (b_1, …, b_depth); the tree has at most Π b leaves (study:
    6-6-6 for long-chain maths)."""

    spo_segment_tokens: int = Field(600, ge=1)
    """spo_tree: M, the most tokens of a segment; a child cut at M is expanded at the next level, the last
    level runs free to the response limit (study: 600 in a 2K context)."""

    spo_adv: Literal["diff", "sibling_std"] = "diff"
    """spo_tree: A(n) = V(n) − V(parent) (`diff`, SPO's default), or divided by the std of n's siblings."""

    spo_prob_mask: float = Field(0.9, gt=0, le=1)
    """spo_tree, *choice* (SPO's): a token enters the loss only if its old probability is below this; 1.0
    turns the mask off."""

    treepo_segment_tokens: int = Field(512, ge=1)
    """treepo: M, the tokens of a segment (study: 512)."""

    treepo_depth: int = Field(14, ge=1)
    """treepo: at most this many segments per path (study: 14)."""

    treepo_width: int = Field(16, ge=2)
    """treepo: w, the leaves each prompt's tree aims for (study: 16)."""

    treepo_first_fork: int = Field(2, ge=1)
    """treepo, *choice*: paths each prompt forks into at the first step."""

    treepo_agg: Literal["mean", "size_weighted"] = "mean"
    """treepo, *choice*: a leaf's advantage is the plain mean of its subgroup advantages, or weighted by
    subgroup size."""

    treepo_center: bool = True
    """treepo: subtract the batch token mean before dividing by the std (the released code); false divides
    only (the paper)."""

    @model_validator(mode="after")
    def _consistent(self) -> AlgoConfig:
        for check in METHOD_CHECKS.get(self.algorithm, ()):
            check(self)
        if min(self.spo_branching) < 1:
            raise ValueError(f"spo_branching = {list(self.spo_branching)}: every level needs >= 1 child")
        return self


def probes_fit_budget(algo: AlgoConfig) -> None:
    need = algo.max_pivots * algo.continuations_per_pivot
    if need > algo.probe_budget:
        raise ValueError(
            f"max_pivots × continuations_per_pivot = {algo.max_pivots} × {algo.continuations_per_pivot}"
            f" = {need} exceeds probe_budget = {algo.probe_budget}: lower max_pivots or"
            " continuations_per_pivot, or raise probe_budget"
        )


def first_fork_fits_width(algo: AlgoConfig) -> None:
    if algo.treepo_first_fork > algo.treepo_width:
        raise ValueError(
            f"treepo_first_fork = {algo.treepo_first_fork} exceeds treepo_width = {algo.treepo_width}:"
            " every path ends as a leaf, so the first fork can be at most the tree's width"
        )


ConfigCheck = Callable[[AlgoConfig], None]
"""Raises ValueError, naming the fields, when a method cannot run with these settings."""
METHOD_CHECKS: dict[str, tuple[ConfigCheck, ...]] = {
    "probepo": (probes_fit_budget,),
    "treepo": (first_fork_fits_width,),
}
"""The consistency checks of the fields a method uses, by method (pure rules of this module: the method
table, probepo.methods, sits above config and is not read here); a method without checks is absent."""
