"""probepo.algo.spo_tree: SPO-tree's values, edge advantages, probability mask, branching (BASELINES.md)."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from probepo.algo.advantage import group_advantages
from probepo.algo.spo_tree import (
    spo_children,
    spo_prob_mask,
    spo_token_advantages,
    spo_tree_advantages,
    spo_tree_values,
)
from probepo.algo.tree import tree_leaves
from tests.unit import tree_reference
from tests.unit.trees import F64, depth_one_forest, forests, relabel

EPS = 1e-6


# ---------------------------------------------------------------- SPO-tree: hand-worked


# Tree 1 (branching 3-2-2, early finishers A, B1, C1, C2), nodes deliberately out of order:
#   R ─ A (r=1, stopped at level 1)
#     ─ B ─ B1 (r=1, stopped at level 2)
#         ─ B2 ─ B2a (r=0), B2b (r=1)   (last level)
#     ─ C ─ C1 (r=0), C2 (r=0)
# V(B2) = 0.5, V(B) = (1 + 0.5)/2 = 0.75, V(C) = 0, V(A) = 1, V(R) = (1 + 0.75 + 0)/3 = 7/12
# (the mean over R's six leaves would be 0.5: values average children, not leaves).
# Tree 2: root with two leaves of reward 1: V = 1 everywhere, every advantage exactly 0.
#           B2a  R   A  C1  B  B2  B1  C  B2b  C2  R'  l1  l2
SPO_PARENT = [5, -1, 1, 7, 1, 4, 4, 1, 5, 7, -1, 10, 10]
SPO_DEPTH = [3, 0, 1, 2, 1, 2, 2, 1, 3, 2, 0, 1, 1]
SPO_REWARD = [0, 0.3, 1, 0, 0.9, 0.2, 1, 0.4, 1, 0, 0.7, 1, 1]  # junk at interior nodes: ignored


def spo_hand_tree() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.tensor(SPO_PARENT), torch.tensor(SPO_DEPTH), torch.tensor(SPO_REWARD, dtype=F64)


def test_spo_values_hand_example():
    values = spo_tree_values(*spo_hand_tree())
    expected = [0, 7 / 12, 1, 0, 0.75, 0.5, 1, 0, 1, 0, 1, 1, 1]
    torch.testing.assert_close(values, torch.tensor(expected, dtype=F64))


def test_spo_edge_advantages_hand_example():
    adv = spo_tree_advantages(*spo_hand_tree())
    # A = V(n) − V(parent): A: 1 − 7/12, B: 0.75 − 7/12, C: −7/12, B1: 0.25, B2: −0.25, B2a/b: ∓0.5,
    # C1 and C2: 0 (rows dropped), roots 0, tree 2: exactly 0.
    expected = [-0.5, 0, 5 / 12, 0, 1 / 6, -0.25, 0.25, -7 / 12, 0.5, 0, 0, 0, 0]
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=F64))
    assert adv[[1, 3, 9, 10, 11, 12]].tolist() == [0.0] * 6  # exact zeros, not rounding residues


def test_spo_sibling_std_hand_example():
    adv = spo_tree_advantages(*spo_hand_tree(), adv="sibling_std")
    # Population std of the siblings' values: R's children (1, 0.75, 0) about 7/12: variance
    # ((5/12)² + (2/12)² + (7/12)²)/3 = 13/72; B's children (1, 0.5): 0.25; B2's (0, 1): 0.5; C's: 0.
    s = math.sqrt(13 / 72)
    expected = [
        -0.5 / (0.5 + EPS),
        0,
        (5 / 12) / (s + EPS),
        0,
        (1 / 6) / (s + EPS),
        -0.25 / (0.25 + EPS),
        0.25 / (0.25 + EPS),
        (-7 / 12) / (s + EPS),
        0.5 / (0.5 + EPS),
        0,
        0,
        0,
        0,
    ]
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=F64))
    assert adv[[3, 9, 11, 12]].tolist() == [0.0] * 4  # zero sibling spread: exactly 0, not 0 / eps noise


def test_spo_only_child_has_zero_advantage():
    # R ─ a ─ {b (r=1), c (r=0)}: a is an only child, V(a) = V(R) = 0.5 exactly.
    parent, depth = torch.tensor([-1, 0, 1, 1]), torch.tensor([0, 1, 2, 2])
    reward = torch.tensor([0.0, 0.0, 1.0, 0.0])
    for adv in ("diff", "sibling_std"):
        out = spo_tree_advantages(parent, depth, reward, adv=adv)
        assert out[:2].tolist() == [0.0, 0.0]
    assert spo_tree_values(parent, depth, torch.tensor([0, 0, 1, 0])).dtype == torch.get_default_dtype()


# ---------------------------------------------------------------- SPO-tree: properties


@given(forests())
@settings(max_examples=60, deadline=None)
def test_spo_matches_reference(forest):
    values = spo_tree_values(forest.parent, forest.depth, forest.reward)
    advs = {
        adv: spo_tree_advantages(forest.parent, forest.depth, forest.reward, adv=adv)
        for adv in ("diff", "sibling_std")
    }
    for nodes in forest.trees():
        parent, reward = forest.local(nodes)
        torch.testing.assert_close(
            values[nodes], torch.tensor(tree_reference.spo_values(parent, reward), dtype=F64)
        )
        for adv, out in advs.items():
            expected = tree_reference.spo_advantages(parent, reward, adv=adv)
            torch.testing.assert_close(out[nodes], torch.tensor(expected, dtype=F64))


@given(
    st.lists(st.lists(st.sampled_from([0.0, 1.0, 0.25, 0.1]), min_size=1, max_size=6), min_size=1, max_size=4)
)
def test_spo_depth_one_is_the_group_baseline(groups):
    forest = depth_one_forest(groups)
    adv = spo_tree_advantages(forest.parent, forest.depth, forest.reward)
    leaves = forest.parent >= 0
    # A = r − mean(r) over the prompt's responses: Dr.GRPO's group advantage, exactly 0 for equal rewards.
    torch.testing.assert_close(
        adv[leaves],
        group_advantages(forest.reward[leaves], forest.parent[leaves], scale="none"),
        rtol=0,
        atol=1e-12,
    )
    assert (adv[~leaves] == 0).all()


@given(forests(), st.integers(0, 2**32 - 1))
@settings(max_examples=40, deadline=None)
def test_spo_node_order_is_irrelevant(forest, seed):
    perm = torch.randperm(len(forest.parent), generator=torch.Generator().manual_seed(seed))
    shuffled = relabel(forest, perm)
    for adv in ("diff", "sibling_std"):
        expected = spo_tree_advantages(forest.parent, forest.depth, forest.reward, adv=adv)[perm]
        got = spo_tree_advantages(shuffled.parent, shuffled.depth, shuffled.reward, adv=adv)
        torch.testing.assert_close(got, expected)


def test_spo_children_grow_the_study_tree():
    # Branching 3-2-2 grown level by level with random early stops: every interior node at level ℓ has
    # b_{ℓ+1} children, every leaf stopped or lies at level 3, nothing is pruned.
    branching = [3, 2, 2]
    gen = torch.Generator().manual_seed(0)
    parent, depth, stopped = torch.tensor([-1]), torch.tensor([0]), torch.tensor([False])
    frontier = torch.tensor([0])
    while frontier.numel():
        counts = spo_children(depth[frontier], stopped[frontier], branching)
        expected = [
            tree_reference.spo_child_count(d, s, branching)
            for d, s in zip(depth[frontier].tolist(), stopped[frontier].tolist(), strict=True)
        ]
        assert counts.tolist() == expected
        new_parent = frontier.repeat_interleave(counts)
        frontier = torch.arange(len(parent), len(parent) + len(new_parent))
        parent = torch.cat([parent, new_parent])
        depth = torch.cat([depth, depth[new_parent] + 1])
        stopped = torch.cat([stopped, torch.rand(len(new_parent), generator=gen) < 0.3])
    kids = torch.bincount(parent[parent >= 0], minlength=len(parent))
    interior = kids > 0
    assert (kids[interior] == torch.tensor([0, *branching])[depth[interior] + 1]).all()
    leaves = tree_leaves(parent)
    assert (stopped[leaves] | (depth[leaves] == 3)).all() and leaves.sum() <= 12
    assert (depth[leaves] < 3).any()  # early finishers give shallower leaves
    spo_tree_advantages(parent, depth, torch.rand(len(parent), generator=gen))  # a valid tree


def test_spo_children_rejects_bad_plans():
    with pytest.raises(ValueError, match="branching"):
        spo_children(torch.tensor([0]), torch.tensor([False]), [2, 0])
    with pytest.raises(ValueError, match="depth"):
        spo_children(torch.tensor([3]), torch.tensor([False]), [2, 2])
    with pytest.raises(ValueError, match="stopped"):
        spo_children(torch.tensor([0]), torch.tensor([True]), [2])


# ---------------------------------------------------------------- SPO-tree: probability mask and whitening


def test_prob_mask_threshold_and_off_switch():
    probs = torch.tensor([[0.5, 0.91, 0.95, 1.0, 0.2], [0.89, 1.0, 0.1, 0.3, 0.99]], dtype=F64)
    mask = torch.tensor([[True, True, True, True, False], [True, True, True, False, False]])
    kept = spo_prob_mask(probs.log(), mask)
    assert kept.tolist() == [[True, False, False, False, False], [True, False, True, False, False]]
    # 1.0 keeps every response token, even those of probability exactly 1 (log-prob 0); never padding.
    assert torch.equal(spo_prob_mask(probs.log(), mask, threshold=1.0), mask)
    for threshold in (0.0, 1.5, -1.0):
        with pytest.raises(ValueError, match="threshold"):
            spo_prob_mask(probs.log(), mask, threshold=threshold)


@given(st.integers(0, 2**32 - 1), st.sampled_from([0.9, 0.5, 1.0]))
@settings(max_examples=60, deadline=None)
def test_spo_token_advantages_are_whitened_over_kept_tokens(seed, threshold):
    rng = random.Random(seed)
    n_rows, n_positions = rng.randint(1, 6), rng.randint(1, 8)
    lengths = torch.tensor([rng.randint(1, n_positions) for _ in range(n_rows)])
    mask = torch.arange(n_positions) < lengths[:, None]
    old_logp = torch.tensor(
        [
            [math.log(rng.choice([1.0, 0.95, rng.uniform(0.01, 1)])) for _ in range(n_positions)]
            for _ in range(n_rows)
        ],
        dtype=F64,
    )
    edge_adv = torch.tensor(
        [rng.choice([0.0, 0.5, -0.25, rng.uniform(-1, 1)]) for _ in range(n_rows)], dtype=F64
    )
    adv, loss_mask = spo_token_advantages(edge_adv, mask, old_logp, prob_mask=threshold)

    expected_mask = [
        [
            bool(mask[r, t])
            and edge_adv[r].item() != 0
            and tree_reference.prob_kept(old_logp[r, t].item(), threshold)
            for t in range(n_positions)
        ]
        for r in range(n_rows)
    ]
    assert loss_mask.tolist() == expected_mask
    assert (adv[~loss_mask] == 0).all()
    kept = adv[loss_mask]
    raw = edge_adv[:, None].expand(mask.shape)[loss_mask]
    if kept.numel() > 1 and (raw != raw[0]).any():
        torch.testing.assert_close(kept.mean(), torch.tensor(0.0, dtype=F64), atol=1e-12, rtol=0)
        torch.testing.assert_close(kept.std(), torch.tensor(1.0, dtype=F64))
        torch.testing.assert_close(kept, (raw - raw.mean()) / raw.std())
    else:
        assert (kept == 0).all()  # no spread, no signal


# ---------------------------------------------------------------- validation


def test_tree_functions_reject_bad_trees():
    reward = torch.zeros(3)
    with pytest.raises(ValueError, match=r"parent\[1\]"):
        spo_tree_values(torch.tensor([-1, 5, 0]), torch.tensor([0, 1, 1]), reward)
    with pytest.raises(ValueError, match=r"parent\[1\]"):
        spo_tree_values(torch.tensor([-1, 1, 0]), torch.tensor([0, 1, 1]), reward)  # its own parent
    with pytest.raises(ValueError, match=r"depth\[2\]"):
        spo_tree_values(torch.tensor([-1, 0, 0]), torch.tensor([0, 1, 2]), reward)
    with pytest.raises(ValueError, match=r"depth\[1\]"):
        spo_tree_values(torch.tensor([-1, 2, 1]), torch.tensor([0, 1, 1]), reward)  # a cycle 1 ↔ 2
    with pytest.raises(ValueError, match="root 2 has no children"):
        spo_tree_values(torch.tensor([-1, 0, -1]), torch.tensor([0, 1, 0]), reward)
    with pytest.raises(ValueError, match="reward"):
        spo_tree_values(torch.tensor([-1, 0]), torch.tensor([0, 1]), reward)
    with pytest.raises(ValueError, match="adv"):
        spo_tree_advantages(torch.tensor([-1, 0]), torch.tensor([0, 1]), torch.zeros(2), adv="std")
