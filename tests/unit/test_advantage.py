"""probepo.algo.advantage: GRPO, shrinkage, redistribution, VinePPO (ALGORITHM.md §1, §3, §4, §6)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from probepo.algo.advantage import (
    group_advantages,
    group_stats,
    grpo_advantages,
    redistribute,
    rloo_advantages,
    shrink_values,
    vineppo_advantages,
)
from tests.unit import reference
from tests.unit.batches import Batch, batches

F64 = torch.float64


def probepo_advantages(
    batch: Batch, *, weight: float = 1.0, scale: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """The §1 + §4 pipeline on a batch: GRPO per response, then redistribution with its group mean as V_0."""
    seq_adv = group_advantages(batch.rewards, batch.group)
    baseline, _ = group_stats(batch.rewards, batch.group)
    return redistribute(
        seq_adv,
        batch.rewards,
        baseline,
        batch.mask,
        batch.pivot_pos,
        batch.pivot_val,
        weight=weight,
        scale=scale,
    )


# ---------------------------------------------------------------- GRPO


def test_grpo_hand_example():
    # Group [1, 0, 0, 1]: mean 0.5, Bessel std sqrt(4 · 0.25 / 3) = 0.577350…, A = ±0.5 / (0.577350… + 1e-6).
    # Group [1, 0, 0, 0]: mean 0.25, std sqrt((0.5625 + 3 · 0.0625) / 3) = 0.5, A = 0.75/0.5, −0.25/0.5.
    rewards = torch.tensor([[1.0, 0, 0, 1], [1, 0, 0, 0]], dtype=F64)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    expected = torch.tensor(
        [[a, -a, -a, a], [0.75 / 0.500001, -0.25 / 0.500001, -0.25 / 0.500001, -0.25 / 0.500001]]
    )
    torch.testing.assert_close(grpo_advantages(rewards), expected.to(F64))
    # Dr.GRPO: no division.
    expected_none = torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.75, -0.25, -0.25, -0.25]], dtype=F64)
    torch.testing.assert_close(grpo_advantages(rewards, scale="none"), expected_none)


@pytest.mark.parametrize("scale", ["std", "none"])
def test_grpo_singleton_and_uniform_groups_are_exactly_zero(scale):
    # 0.1 is not representable: a naive mean leaves a rounding residue that std normalisation blows up.
    uniform = torch.tensor([[0.1, 0.1, 0.1], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    assert torch.equal(grpo_advantages(uniform, scale=scale), torch.zeros(3, 3))
    singleton = torch.tensor([[1.0], [0.0], [0.3]])
    assert torch.equal(grpo_advantages(singleton, scale=scale), torch.zeros(3, 1))
    mean, std = group_stats(torch.tensor([0.1, 0.1, 0.7]), torch.tensor([5, 5, 9]))
    assert mean.tolist() == pytest.approx([0.1, 0.1, 0.7]) and std.tolist() == [0.0, 0.0, 0.0]
    assert mean[0].item() == torch.tensor(0.1).item()  # exact, not a rounding neighbour


@given(batches())
@settings(max_examples=60, deadline=None)
def test_group_advantages_match_reference_and_dense_version(batch):
    for scale in ("std", "none"):
        adv = group_advantages(batch.rewards, batch.group, scale=scale)
        for gid in batch.group.unique():
            rows = (batch.group == gid).nonzero().flatten()
            expected = reference.grpo(batch.rewards[rows].tolist(), scale=scale)
            torch.testing.assert_close(adv[rows], torch.tensor(expected, dtype=F64))
            # The dense [P, G] entry point agrees with the ragged one on the same group.
            dense = grpo_advantages(batch.rewards[rows][None, :], scale=scale)[0]
            torch.testing.assert_close(dense, adv[rows])


@given(batches())
@settings(max_examples=40, deadline=None)
def test_group_stats_broadcast_torch_mean_and_std(batch):
    mean, std = group_stats(batch.rewards, batch.group)
    for gid in batch.group.unique():
        rows = batch.group == gid
        r = batch.rewards[rows]
        torch.testing.assert_close(mean[rows], r.mean().expand(len(r)))
        expected_std = r.std() if len(r) > 1 else torch.tensor(0.0, dtype=F64)
        torch.testing.assert_close(std[rows], expected_std.expand(len(r)))


# ---------------------------------------------------------------- RLOO


def test_rloo_hand_example():
    # Group a = [1, 0, 0, 1]: the others' means are 1/3, 2/3, 2/3, 1/3, so A = ±2/3.
    # Group b = [1, 0, 0] (ids interleaved with a): others' means 0, 1/2, 1/2, so A = 1, -1/2, -1/2.
    # Group c = [1] alone: nothing to compare with, 0.
    rewards = torch.tensor([1.0, 1, 0, 0, 0, 0, 1, 1], dtype=F64)
    group = torch.tensor([7, 3, 7, 3, 7, 3, 7, 9])
    expected = torch.tensor([2 / 3, 1, -2 / 3, -1 / 2, -2 / 3, -1 / 2, 2 / 3, 0], dtype=F64)
    torch.testing.assert_close(rloo_advantages(rewards, group), expected)


def test_rloo_singleton_and_uniform_groups_are_exactly_zero():
    rewards = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.3])  # 0.1 is not representable: no rounding residue
    assert torch.equal(rloo_advantages(rewards, torch.tensor([0, 0, 0, 1, 2])), torch.zeros(5))


@given(batches())
@settings(max_examples=60, deadline=None)
def test_rloo_matches_reference_and_is_grpo_without_std_rescaled(batch):
    adv = rloo_advantages(batch.rewards, batch.group)
    for gid in batch.group.unique():
        rows = (batch.group == gid).nonzero().flatten()
        expected = reference.rloo(batch.rewards[rows].tolist())
        torch.testing.assert_close(adv[rows], torch.tensor(expected, dtype=F64))
        # RLOO is Dr.GRPO's r - mean scaled by G / (G - 1): the same direction, a larger step.
        size = len(rows)
        if size > 1:
            dr_grpo = group_advantages(batch.rewards[rows], batch.group[rows], scale="none")
            torch.testing.assert_close(adv[rows], dr_grpo * size / (size - 1))


def test_grpo_rejects_unknown_scale():
    with pytest.raises(ValueError, match="scale"):
        grpo_advantages(torch.zeros(2, 2), scale="mad")


# ---------------------------------------------------------------- shrinkage


def test_shrink_values_hand_example():
    # (k + κ r̄) / (K + κ) with κ = 4, r̄ = 0.5: k = 3 → (3 + 2) / 12; k = 8 → 10 / 12; k = 0 → 2 / 12.
    values = shrink_values(torch.tensor([3, 8, 0]), 8, torch.tensor(0.5))
    torch.testing.assert_close(values, torch.tensor([5 / 12, 10 / 12, 2 / 12]))
    assert values.dtype == torch.get_default_dtype()


@given(
    st.lists(st.integers(0, 16), min_size=1, max_size=6),
    st.floats(0, 1),
    st.floats(0.1, 20),
)
def test_shrink_values_limits(successes, prior, kappa):
    k = torch.tensor(successes, dtype=F64)
    trials = torch.full_like(k, 16)
    # κ = 0: the empirical mean.
    torch.testing.assert_close(shrink_values(k, trials, prior, kappa=0.0), k / 16)
    # No trials: the prior (for any κ > 0), never NaN.
    torch.testing.assert_close(
        shrink_values(k * 0, trials * 0, prior, kappa=kappa), torch.full_like(k, prior)
    )
    # In between, the value lies between the empirical mean and the prior.
    v = shrink_values(k, trials, prior, kappa=kappa)
    low, high = (
        torch.minimum(k / 16, torch.tensor(prior, dtype=F64)),
        torch.maximum(k / 16, torch.tensor(prior)),
    )
    assert ((v >= low - 1e-12) & (v <= high + 1e-12)).all()


def test_shrink_values_no_trials_no_pseudocount_is_the_prior():
    values = shrink_values(torch.tensor([0, 2]), torch.tensor([0, 4]), torch.tensor([0.3, 0.3]), kappa=0.0)
    assert values.tolist() == pytest.approx([0.3, 0.5])
    assert not values.isnan().any()


def test_shrink_values_broadcasts():
    k = torch.arange(3)[:, None]  # [3, 1]
    prior = torch.tensor([0.0, 0.25, 0.5, 1.0])  # [4]
    values = shrink_values(k, 8, prior)
    assert values.shape == (3, 4)
    torch.testing.assert_close(values[2, 1], torch.tensor((2 + 4 * 0.25) / 12))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_shrink_values_keeps_a_floating_prior_dtype(dtype):
    values = shrink_values(torch.tensor([2, 4]), torch.tensor([8, 8]), torch.tensor([0.5, 0.5], dtype=dtype))
    assert values.dtype == dtype
    torch.testing.assert_close(values.double(), torch.tensor([4 / 12, 6 / 12], dtype=F64), atol=1e-2, rtol=0)


def test_shrink_values_rejects_negative_kappa():
    with pytest.raises(ValueError, match="kappa"):
        shrink_values(1, 2, 0.5, kappa=-1.0)


# ---------------------------------------------------------------- redistribution


def test_redistribute_hand_example():
    # T = 6, pivots at 4 and 2 (unsorted slots, a -1 between), r̄ = 0.5, r = 1, V̂(2) = 0.2, V̂(4) = 0.8.
    # Boundary values 0.5 | 0.2 | 0.8 | 1 → δ = −0.3 on [0, 2), +0.6 on [2, 4), +0.2 on [4, 6).
    # mean ρ = (2·(−0.3) + 2·0.6 + 2·0.2) / 6 = 1/6 → c = −0.4667, 0.4333, 0.0333 (each twice).
    # Second response: T = 4 of 6, no pivots: A = A_i on its tokens, 0 on padding.
    mask = torch.arange(6) < torch.tensor([[6], [4]])
    adv = redistribute(
        seq_adv=torch.tensor([1.0, -1.0], dtype=F64),
        rewards=torch.tensor([1.0, 0.0], dtype=F64),
        baseline=torch.tensor([0.5, 0.5], dtype=F64),
        mask=mask,
        pivot_pos=torch.tensor([[4, -1, 2], [-1, -1, -1]]),
        pivot_val=torch.tensor([[0.8, 0.0, 0.2], [0.0, 0.0, 0.0]], dtype=F64),
    )
    c = [-0.3 - 1 / 6, 0.6 - 1 / 6, 0.2 - 1 / 6]
    expected = [[1 + c[0], 1 + c[0], 1 + c[1], 1 + c[1], 1 + c[2], 1 + c[2]], [-1, -1, -1, -1, 0, 0]]
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=F64))
    # λ = 0.5 and scale 2 divide the residual by 4.
    half = redistribute(
        torch.tensor([1.0], dtype=F64),
        torch.tensor([1.0], dtype=F64),
        torch.tensor([0.5], dtype=F64),
        mask[:1],
        torch.tensor([[2, 4]]),
        torch.tensor([[0.2, 0.8]], dtype=F64),
        weight=0.5,
        scale=2.0,
    )
    torch.testing.assert_close(half[0], torch.tensor([1 + x / 4 for x in c for _ in range(2)], dtype=F64))


@given(batches())
@settings(max_examples=80, deadline=None)
def test_redistribute_keeps_each_token_mean(batch):
    seq_adv = group_advantages(batch.rewards, batch.group)
    adv = probepo_advantages(batch, scale=0.3)
    token_mean = adv.sum(1) / batch.mask.sum(1)
    torch.testing.assert_close(token_mean, seq_adv, rtol=0, atol=1e-12)
    assert (adv[~batch.mask] == 0).all()


@given(batches())
@settings(max_examples=50, deadline=None)
def test_redistribute_without_pivots_or_weight_is_exactly_grpo(batch):
    grpo_tokens = torch.where(batch.mask, group_advantages(batch.rewards, batch.group)[:, None], 0)
    no_pivots = Batch(
        batch.group, batch.rewards, batch.mask, torch.full_like(batch.pivot_pos, -1), batch.pivot_val
    )
    assert torch.equal(probepo_advantages(no_pivots), grpo_tokens)
    assert torch.equal(probepo_advantages(batch, weight=0.0), grpo_tokens)


@given(batches(), st.integers(0, 2**32 - 1))
@settings(max_examples=50, deadline=None)
def test_permuting_responses_within_a_group_permutes_advantages(batch, seed):
    # Shuffle rows only among rows of the same group (the permutation fixes the group column).
    gen = torch.Generator().manual_seed(seed)
    perm = torch.arange(len(batch.group))
    for gid in batch.group.unique():
        rows = (batch.group == gid).nonzero().flatten()
        perm[rows] = rows[torch.randperm(len(rows), generator=gen)]
    permuted = Batch(
        batch.group[perm], batch.rewards[perm], batch.mask[perm], batch.pivot_pos[perm], batch.pivot_val[perm]
    )
    torch.testing.assert_close(probepo_advantages(permuted), probepo_advantages(batch)[perm])


@given(batches(), st.sampled_from(["float", "per-response"]))
@settings(max_examples=60, deadline=None)
def test_redistribute_matches_reference(batch, scale_kind):
    seq_adv = torch.linspace(-1, 1, len(batch.group), dtype=F64)
    baseline = torch.full_like(batch.rewards, 0.4)
    scale = 0.7 if scale_kind == "float" else torch.linspace(0.1, 2, len(batch.group), dtype=F64)
    adv = redistribute(
        seq_adv,
        batch.rewards,
        baseline,
        batch.mask,
        batch.pivot_pos,
        batch.pivot_val,
        weight=1.3,
        scale=scale,
    )
    for row, length in enumerate(batch.lengths):
        expected = reference.redistribute(
            seq_adv[row].item(),
            batch.rewards[row].item(),
            0.4,
            length,
            batch.pivots(row),
            weight=1.3,
            scale=scale if scale_kind == "float" else scale[row].item(),
        )
        torch.testing.assert_close(adv[row, :length], torch.tensor(expected, dtype=F64))


def test_redistribute_rejects_bad_pivots_and_masks():
    mask = torch.arange(5) < torch.tensor([[5], [3]])
    ones = torch.ones(2, dtype=F64)

    def call(pivot_pos, mask=mask, scale=1.0):
        pivot_pos = torch.tensor(pivot_pos)
        return redistribute(
            ones, ones, ones, mask, pivot_pos, torch.zeros(pivot_pos.shape, dtype=F64), scale=scale
        )

    call([[1, 4], [2, -1]])  # valid: 1 ≤ t ≤ T_i − 1
    for bad, row in [
        ([[0, -1], [-1, -1]], 0),
        ([[-1, -1], [3, -1]], 1),
        ([[2, 2], [-1, -1]], 0),
        ([[1, -1], [-2, -1]], 1),
    ]:
        with pytest.raises(ValueError, match=f"pivot_pos row {row}"):
            call(bad)
    with pytest.raises(ValueError, match="mask row 1"):
        call([[-1], [-1]], mask=torch.tensor([[True] * 5, [False, True, True, False, False]]))
    with pytest.raises(ValueError, match="scale"):
        call([[-1], [-1]], scale=torch.tensor([1.0, 0.0]))


@given(batches())
@settings(max_examples=20, deadline=None)
def test_advantage_functions_leave_inputs_unchanged(batch):
    before = [t.clone() for t in (batch.rewards, batch.group, batch.mask, batch.pivot_pos, batch.pivot_val)]
    probepo_advantages(batch)
    vineppo_advantages(batch.rewards, batch.rewards * 0 + 0.5, batch.mask, batch.pivot_pos, batch.pivot_val)
    after = (batch.rewards, batch.group, batch.mask, batch.pivot_pos, batch.pivot_val)
    assert all(torch.equal(b, a) for b, a in zip(before, after, strict=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_redistribute_low_precision_dtypes(dtype):
    mask = torch.ones(1, 6, dtype=torch.bool)
    args = [torch.tensor([x], dtype=dtype) for x in (1.0, 1.0, 0.5)]
    adv = redistribute(*args, mask, torch.tensor([[2, 4]]), torch.tensor([[0.2, 0.8]], dtype=dtype))
    assert adv.dtype == dtype
    expected = torch.tensor([1 - 0.3 - 1 / 6] * 2 + [1 + 0.6 - 1 / 6] * 2 + [1 + 0.2 - 1 / 6] * 2)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(adv[0].float(), expected, rtol=tol, atol=tol)


# ---------------------------------------------------------------- VinePPO


def test_vineppo_hand_example():
    # Response 0 (T = 4, pivot at 2 with V = 1): δ = 1 − 0.5 = 0.5 on [0, 2), 1 − 1 = 0 on [2, 4).
    # Response 1 (T = 2, no pivots, r = 0): δ = −0.5 on both tokens.
    # Tokens [0.5, 0.5, 0, 0, −0.5, −0.5]: mean 0, Bessel std sqrt(1 / 5) → ρ · sqrt(5).
    mask = torch.arange(4) < torch.tensor([[4], [2]])
    adv = vineppo_advantages(
        torch.tensor([1.0, 0.0], dtype=F64),
        torch.tensor([0.5, 0.5], dtype=F64),
        mask,
        torch.tensor([[2], [-1]]),
        torch.tensor([[1.0], [0.0]], dtype=F64),
    )
    s = math.sqrt(5)
    torch.testing.assert_close(
        adv, torch.tensor([[0.5 * s, 0.5 * s, 0, 0], [-0.5 * s, -0.5 * s, 0, 0]], dtype=F64)
    )


@given(batches())
@settings(max_examples=60, deadline=None)
def test_vineppo_matches_reference_and_is_whitened(batch):
    baseline, _ = group_stats(batch.rewards, batch.group)
    adv = vineppo_advantages(batch.rewards, baseline, batch.mask, batch.pivot_pos, batch.pivot_val)
    expected = (
        reference.vineppo(
            batch.rewards.tolist(),
            baseline.tolist(),
            batch.lengths,
            [batch.pivots(i) for i in range(len(batch.group))],
        )
        if batch.mask.sum() > 1
        else [[0.0] * n for n in batch.lengths]
    )
    for row, length in enumerate(batch.lengths):
        torch.testing.assert_close(
            adv[row, :length], torch.tensor(expected[row], dtype=F64), atol=1e-9, rtol=1e-9
        )
    assert (adv[~batch.mask] == 0).all()
    valid = adv[batch.mask]
    if valid.abs().max() > 0:
        torch.testing.assert_close(valid.mean(), torch.tensor(0.0, dtype=F64), atol=1e-9, rtol=0)
        torch.testing.assert_close(valid.std(), torch.tensor(1.0, dtype=F64))


def test_vineppo_without_spread_is_zero():
    # Every token has δ = r − r̄ = 0.1 (no pivots): no spread, so no signal (not 0/0, not rounding noise).
    mask = torch.arange(5) < torch.tensor([[5], [3]])
    adv = vineppo_advantages(
        torch.tensor([0.1, 0.1]), torch.zeros(2), mask, torch.full((2, 2), -1), torch.zeros(2, 2)
    )
    assert torch.equal(adv, torch.zeros(2, 5))
