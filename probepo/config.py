"""Every configuration model of the project, in one place.

The same pydantic models are the YAML presets in `configs/`, the CLI's input and the Prefect flows'
parameters (each field's docstring becomes the help text of the UI form). Invalid values are rejected
with a message that names the field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    """Base: unknown fields are errors (a typo in a preset must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


class AlgoConfig(_Strict):
    """The maths of one update (ALGORITHM.md): advantages, pivot selection, probing, redistribution, loss.

    Defaults are the study's headline recipe; fields marked *choice* are left open by the study.
    """

    algorithm: Literal["grpo", "probepo", "vineppo"] = "probepo"
    """grpo: one group-normalised advantage per response. probepo: sparse probes redistribute it across
    tokens. vineppo: every step boundary probed, plain Monte-Carlo values, no GRPO term (§6)."""

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

    @model_validator(mode="after")
    def _budget_fits(self) -> AlgoConfig:
        need = self.max_pivots * self.continuations_per_pivot
        if self.algorithm == "probepo" and need > self.probe_budget:
            raise ValueError(
                f"max_pivots × continuations_per_pivot = {self.max_pivots} × {self.continuations_per_pivot}"
                f" = {need} exceeds probe_budget = {self.probe_budget}: lower max_pivots or"
                " continuations_per_pivot, or raise probe_budget"
            )
        return self
