"""probepo.algo.pivots: candidates, windowed entropy, random ablation (ALGORITHM.md §2)."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from probepo.algo.pivots import random_pivots, select_pivots, step_candidates, step_end_from_text, window_max
from tests.unit import reference
from tests.unit.batches import batches

# ---------------------------------------------------------------- step boundaries


def test_step_end_from_text_examples():
    texts = [
        ["First", " we", " add", ".", " Then", "\n", "x", " =", " 3", ".", "14", ".\n"],
        ["Done", '!"', " Is", " it", "?)", " a", ";", " b", "**.", " ok"],
        ["Ġx", "Ġ.", "Ċ", "Ġy", "ĊĊ"],  # raw byte-level BPE token strings
        [],
    ]
    ends = step_end_from_text(texts)
    assert ends.shape == (4, 12)
    assert ends[0].nonzero().flatten().tolist() == [3, 5, 11]  # "3" "." "14" is a decimal point
    assert ends[1].nonzero().flatten().tolist() == [1, 4, 8]  # ";" only with separators
    assert ends[2].nonzero().flatten().tolist() == [1, 2, 4]
    assert not ends[3].any()
    with_semicolon = step_end_from_text(texts[1:2], separators=[";"])
    assert with_semicolon[0].nonzero().flatten().tolist() == [1, 4, 6, 8]


def test_step_candidates_hand_example():
    # T_i = 10, step ends at tokens 0, 2, 5, 7, 8 → positions after them: 1, 3, 6, 8, 9.
    # margin 2 keeps 2 ≤ t ≤ 8: {3, 6, 8}. margin 0 still requires 1 ≤ t ≤ T_i − 1: {1, 3, 6, 8, 9}.
    # The end marker at token 10 (padding) and token 11 never count.
    step_end = torch.zeros(1, 12, dtype=torch.bool)
    step_end[0, [0, 2, 5, 7, 8, 10, 11]] = True
    mask = torch.arange(12)[None, :] < 10
    assert step_candidates(step_end, mask, margin=2)[0].nonzero().flatten().tolist() == [3, 6, 8]
    assert step_candidates(step_end, mask, margin=0)[0].nonzero().flatten().tolist() == [1, 3, 6, 8, 9]


@given(batches(max_len=30), st.integers(0, 6), st.integers(0, 2**32 - 1))
@settings(max_examples=50, deadline=None)
def test_step_candidates_match_reference(batch, margin, seed):
    step_end = torch.rand(batch.mask.shape, generator=torch.Generator().manual_seed(seed)) < 0.3
    candidates = step_candidates(step_end, batch.mask, margin=margin)
    for row, length in enumerate(batch.lengths):
        assert candidates[row].tolist() == reference.step_candidates(step_end[row].tolist(), length, margin)


# ---------------------------------------------------------------- window max


def test_window_max_hand_example():
    # T_i = 5 of 6, W = 3: score[t] = max(H[t], H[t+1], H[t+2]) within the response; -inf on padding.
    entropy = torch.tensor([[0.1, 0.9, 0.2, 0.3, 0.5, 7.0]])
    mask = torch.arange(6)[None, :] < 5
    expected = [0.9, 0.9, 0.5, 0.5, 0.5, -math.inf]  # token 5 (padding, 7.0) never counts
    assert window_max(entropy, mask, window=3)[0].tolist() == pytest.approx(expected)
    assert window_max(entropy, mask, window=1)[0, :5].tolist() == pytest.approx(entropy[0, :5].tolist())


@given(batches(max_len=30), st.integers(1, 10), st.integers(0, 2**32 - 1))
@settings(max_examples=50, deadline=None)
def test_window_max_matches_reference(batch, window, seed):
    entropy = torch.rand(batch.mask.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    score = window_max(entropy, batch.mask, window=window)
    for row, length in enumerate(batch.lengths):
        assert score[row].tolist() == reference.window_max(entropy[row].tolist(), length, window)


def test_window_max_bfloat16_and_rejects_window_zero():
    entropy = torch.tensor([[1.0, 3.0, 2.0]], dtype=torch.bfloat16)
    mask = torch.ones(1, 3, dtype=torch.bool)
    assert window_max(entropy, mask, window=2).tolist() == [[3.0, 3.0, 2.0]]
    with pytest.raises(ValueError, match="window"):
        window_max(entropy, mask, window=0)


# ---------------------------------------------------------------- greedy selection


def test_select_pivots_hand_example():
    # One group of rows 0 and 1, another of row 2; budget 3 per group, spacing 3.
    # Group A candidates (score): row 0: t=2 (0.9), t=4 (0.8), t=8 (0.5); row 1: t=3 (0.85), t=6 (0.1).
    # Picks: (0, 2) 0.9 → drops (0, 4) at distance 2 < 3; then (1, 3) 0.85; then (0, 8) 0.5. Budget spent.
    # Group B, row 2: t=1 (0.3), t=5 (0.3) tie, t=9 (0.2): lowest t first → 1, then 5, then 9 (spacing ok).
    score = torch.zeros(3, 10)
    candidates = torch.zeros(3, 10, dtype=torch.bool)
    for row, t, s in [
        (0, 2, 0.9),
        (0, 4, 0.8),
        (0, 8, 0.5),
        (1, 3, 0.85),
        (1, 6, 0.1),
        (2, 1, 0.3),
        (2, 5, 0.3),
        (2, 9, 0.2),
    ]:
        score[row, t], candidates[row, t] = s, True
    picks = select_pivots(score, candidates, torch.tensor([7, 7, 3]), max_pivots=3, min_spacing=3)
    assert picks.tolist() == [[2, 8, -1], [3, -1, -1], [1, 5, 9]]
    # Budget 1: the best of each group only. Spacing 5 in row 2: 1, then 9 (5 is only 4 away).
    assert select_pivots(score, candidates, torch.tensor([7, 7, 3]), max_pivots=1).tolist() == [
        [2],
        [-1],
        [1],
    ]
    spaced = select_pivots(score, candidates, torch.tensor([7, 7, 3]), max_pivots=3, min_spacing=5)
    assert spaced[2].tolist() == [1, 9, -1]


def test_select_pivots_ties_go_to_the_lowest_row_then_lowest_t():
    score = torch.ones(3, 6)
    candidates = torch.zeros(3, 6, dtype=torch.bool)
    candidates[2, 1] = candidates[1, 4] = candidates[1, 2] = True
    picks = select_pivots(score, candidates, torch.tensor([0, 0, 0]), max_pivots=1, min_spacing=1)
    assert picks.tolist() == [[-1], [2], [-1]]


def random_scores(batch, seed: int, margin: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    entropy = torch.rand(batch.mask.shape, generator=gen, dtype=torch.float64)
    step_end = torch.rand(batch.mask.shape, generator=gen) < 0.4
    return window_max(entropy, batch.mask, window=3), step_candidates(step_end, batch.mask, margin=margin)


@given(
    batches(max_len=40), st.integers(0, 6), st.integers(1, 8), st.integers(0, 3), st.integers(0, 2**32 - 1)
)
@settings(max_examples=80, deadline=None)
def test_select_pivots_properties_and_reference(batch, max_pivots, min_spacing, margin, seed):
    score, candidates = random_scores(batch, seed, margin)
    picks = select_pivots(score, candidates, batch.group, max_pivots=max_pivots, min_spacing=min_spacing)
    assert picks.shape == (len(batch.group), max_pivots)
    chosen = [[t for t in row if t >= 0] for row in picks.tolist()]
    for row, ts in enumerate(chosen):
        assert picks[row].tolist() == ts + [-1] * (max_pivots - len(ts))  # ascending, then -1
        assert all(candidates[row, t] for t in ts)
        assert all(b - a >= min_spacing for a, b in itertools.pairwise(ts))
    for gid in batch.group.unique():
        rows = (batch.group == gid).nonzero().flatten().tolist()
        assert sum(len(chosen[r]) for r in rows) <= max_pivots
        group_scores = score[rows][candidates[rows]]
        if max_pivots and len(group_scores):
            # The first greedy pick is the group's best candidate, so the best candidate is always chosen.
            best = group_scores.max()
            assert any(score[r, t] == best for r in rows for t in chosen[r])
    expected = reference.select_pivots(
        score.tolist(), candidates.tolist(), batch.group.tolist(), max_pivots, min_spacing
    )
    assert chosen == expected


@given(batches(max_len=40), st.integers(0, 2**32 - 1))
@settings(max_examples=40, deadline=None)
def test_select_pivots_permutation_within_groups(batch, seed):
    score, candidates = random_scores(batch, seed, margin=1)  # continuous scores: no ties
    perm = list(range(len(batch.group)))
    rng = random.Random(seed)
    for gid in batch.group.unique():
        rows = (batch.group == gid).nonzero().flatten().tolist()
        for src, dst in zip(rows, rng.sample(rows, len(rows)), strict=True):
            perm[src] = dst
    perm = torch.tensor(perm)
    picks = select_pivots(score, candidates, batch.group, max_pivots=3, min_spacing=4)
    permuted = select_pivots(score[perm], candidates[perm], batch.group[perm], max_pivots=3, min_spacing=4)
    assert torch.equal(permuted, picks[perm])


def test_select_pivots_never_chooses_minus_inf_and_rejects_nan():
    score = torch.tensor([[0.0, -math.inf, 1.0, -math.inf]])
    candidates = torch.tensor([[False, True, True, True]])
    # -inf marks "never": only t = 2 is chosen, with budget left.
    picks = select_pivots(score, candidates, torch.tensor([0]), max_pivots=3, min_spacing=1)
    assert picks.tolist() == [[2, -1, -1]]
    with pytest.raises(ValueError, match="NaN"):
        select_pivots(torch.tensor([[0.0, math.nan, 1.0]]), candidates[:, :3], torch.tensor([0]))


# ---------------------------------------------------------------- random ablation


@given(batches(max_len=30), st.integers(0, 6), st.integers(0, 2**32 - 1))
@settings(max_examples=40, deadline=None)
def test_random_pivots_budget_interior_and_determinism(batch, max_pivots, seed):
    def draw():
        gen = torch.Generator().manual_seed(seed)
        return random_pivots(batch.mask, batch.group, max_pivots=max_pivots, generator=gen)

    picks = draw()
    assert torch.equal(picks, draw())
    lengths = batch.lengths
    for row, ts in enumerate(picks.tolist()):
        valid = [t for t in ts if t >= 0]
        assert valid == sorted(set(valid)) and all(1 <= t <= lengths[row] - 1 for t in valid)
    for gid in batch.group.unique():
        rows = (batch.group == gid).nonzero().flatten().tolist()
        interior = sum(lengths[r] - 1 for r in rows)
        assert (picks[rows] >= 0).sum() == min(max_pivots, interior)  # the whole budget when it fits


def test_random_pivots_are_uniform_over_the_groups_interior_positions():
    # 4,000 copies of one group: responses of lengths 3 and 4 → interior (0,1) (0,2) (1,1) (1,2) (1,3).
    # One pivot per group: each of the 5 positions should take 1/5 of the draws (std of a share ≈ 0.006).
    n_groups = 4000
    mask = torch.arange(4) < torch.tensor([3, 4]).repeat(n_groups)[:, None]
    group = torch.arange(n_groups).repeat_interleave(2)
    picks = random_pivots(mask, group, max_pivots=1, generator=torch.Generator().manual_seed(0))
    picks = picks.view(n_groups, 2)
    counts = torch.stack(
        [(picks[:, 0] == 1), (picks[:, 0] == 2), (picks[:, 1] == 1), (picks[:, 1] == 2), (picks[:, 1] == 3)]
    )
    shares = counts.sum(1) / n_groups
    assert counts.sum(0).eq(1).all()  # exactly one pivot per group
    torch.testing.assert_close(shares, torch.full((5,), 0.2, dtype=shares.dtype), atol=0.025, rtol=0)
