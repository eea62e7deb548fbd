"""probepo.algo.treepo (and the leaf paths of probepo.algo.tree): TreePO's subgroup advantages, batch
normalisation, branching and fallback (BASELINES.md)."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from probepo.algo.advantage import group_advantages
from probepo.algo.tree import leaf_ancestors
from probepo.algo.treepo import treepo_advantages, treepo_children, treepo_normalize, treepo_restarts
from tests.unit import tree_reference
from tests.unit.trees import F64, depth_one_forest, forests, relabel

EPS = 1e-6


# ---------------------------------------------------------------- TreePO: hand-worked


# Tree 1 (nodes 0–9):  R ─ P ─ P1 ─ {a (r=1), b (r=0), e (r=0)}   P has one child: a chain
#                        ─ Q ─ {c (r=1), Q2 ─ d (r=0)}             Q2 a chain to a single leaf
# Tree 2 (nodes 10–11): R' ─ f (r=1), the prompt's only leaf.
#                 R  P  Q  P1  a  b  e  c  Q2  d  R'  f
TREEPO_PARENT = [-1, 0, 0, 1, 3, 3, 3, 2, 2, 8, -1, 10]
TREEPO_DEPTH = [0, 1, 1, 2, 3, 3, 3, 2, 2, 3, 0, 1]
TREEPO_REWARD = [0.5, 0.5, 0.5, 0.5, 1, 0, 0, 1, 0.5, 0, 0.5, 1]


def test_leaf_ancestors_hand_example():
    leaves, ancestors = leaf_ancestors(torch.tensor(TREEPO_PARENT), torch.tensor(TREEPO_DEPTH))
    assert leaves.tolist() == [4, 5, 6, 7, 9, 11]
    assert ancestors.tolist() == [
        [0, 1, 3, 4],
        [0, 1, 3, 5],
        [0, 1, 3, 6],
        [0, 2, 7, -1],
        [0, 2, 8, 9],
        [10, 11, -1, -1],
    ]


def test_treepo_subgroup_averages_hand_example():
    leaves, ancestors = leaf_ancestors(torch.tensor(TREEPO_PARENT), torch.tensor(TREEPO_DEPTH))
    reward = torch.tensor(TREEPO_REWARD, dtype=F64)[leaves]
    # G_0 = {a, b, e, c, d}, mean 2/5. P and P1 hold the same set {a, b, e} (mean 1/3): counted ONCE.
    # Q = {c, d} (mean 1/2). Q2 = {d} and the leaves themselves are singletons: not counted.
    #   a: (0.6 + 2/3)/2 = 19/30     (counting the chain's set twice, as the released code, would give 0.6444)
    #   b, e: (−0.4 − 1/3)/2 = −11/30
    #   c: (0.6 + 0.5)/2 = 0.55;  d: (−0.4 − 0.5)/2 = −0.45;  f: no subgroup → 0.
    mean = treepo_advantages(ancestors, reward)
    torch.testing.assert_close(mean, torch.tensor([19 / 30, -11 / 30, -11 / 30, 0.55, -0.45, 0], dtype=F64))
    # Size-weighted: a: (5·0.6 + 3·2/3)/8, b: (5·−0.4 + 3·−1/3)/8,
    # c: (5·0.6 + 2·0.5)/7, d: (5·−0.4 − 2·0.5)/7.
    weighted = treepo_advantages(ancestors, reward, agg="size_weighted")
    torch.testing.assert_close(weighted, torch.tensor([5 / 8, -3 / 8, -3 / 8, 4 / 7, -3 / 7, 0], dtype=F64))
    assert mean[-1].item() == 0.0 and weighted[-1].item() == 0.0
    # Any labels work as long as equal prefixes have equal labels.
    relabelled = torch.where(ancestors >= 0, ancestors * 7 + 100, -1)
    torch.testing.assert_close(treepo_advantages(relabelled, reward), mean)


def test_treepo_normalize_hand_example():
    # Tokens [1, 1, 1, −1]: mean 0.5, Bessel variance (3·0.25 + 2.25)/3 = 1 → A = [0.5, −1.5];
    # without centring A = Ã / σ = [1, −1].
    leaf_adv, n_tokens = torch.tensor([1.0, -1.0], dtype=F64), torch.tensor([3, 1])
    torch.testing.assert_close(treepo_normalize(leaf_adv, n_tokens), torch.tensor([0.5, -1.5], dtype=F64))
    torch.testing.assert_close(
        treepo_normalize(leaf_adv, n_tokens, center=False), torch.tensor([1.0, -1.0], dtype=F64)
    )
    # No spread, or fewer than two tokens: all zeros.
    assert treepo_normalize(torch.tensor([0.1, 0.1, 0.1]), torch.tensor([2, 3, 0])).tolist() == [0.0] * 3
    assert treepo_normalize(torch.tensor([1.0, 0.0]), torch.tensor([1, 0])).tolist() == [0.0, 0.0]


# ---------------------------------------------------------------- TreePO: properties


@given(forests(max_depth=5))
@settings(max_examples=60, deadline=None)
def test_treepo_matches_reference(forest):
    leaves, ancestors = leaf_ancestors(forest.parent, forest.depth)
    row = {int(node): k for k, node in enumerate(leaves)}
    for agg in ("mean", "size_weighted"):
        adv = treepo_advantages(ancestors, forest.reward[leaves], agg=agg)
        for nodes in forest.trees():
            tree_leaf_nodes = [n for n in nodes if n in row]
            paths = [forest.path(n) for n in tree_leaf_nodes]
            assert [
                ancestors[row[n], : len(p)].tolist() for n, p in zip(tree_leaf_nodes, paths, strict=True)
            ] == paths
            expected = tree_reference.treepo_advantages(
                paths, forest.reward[tree_leaf_nodes].tolist(), agg=agg
            )
            torch.testing.assert_close(
                adv[[row[n] for n in tree_leaf_nodes]], torch.tensor(expected, dtype=F64)
            )


@given(
    st.lists(st.lists(st.sampled_from([0.0, 1.0, 0.25, 0.1]), min_size=1, max_size=6), min_size=1, max_size=4)
)
def test_treepo_depth_one_is_the_group_baseline(groups):
    forest = depth_one_forest(groups)
    leaves, ancestors = leaf_ancestors(forest.parent, forest.depth)
    for agg in ("mean", "size_weighted"):
        adv = treepo_advantages(ancestors, forest.reward[leaves], agg=agg)
        # Ã_i = r_i − mean(r) (before normalisation); exactly 0 for a prompt of one or of equal rewards.
        expected = group_advantages(forest.reward[leaves], forest.parent[leaves], scale="none")
        torch.testing.assert_close(adv, expected, rtol=0, atol=1e-12)


@given(forests(), st.integers(0, 2**32 - 1))
@settings(max_examples=40, deadline=None)
def test_treepo_permuting_leaves_permutes_advantages(forest, seed):
    leaves, ancestors = leaf_ancestors(forest.parent, forest.depth)
    reward = forest.reward[leaves]
    perm = torch.randperm(len(leaves), generator=torch.Generator().manual_seed(seed))
    for agg in ("mean", "size_weighted"):
        torch.testing.assert_close(
            treepo_advantages(ancestors[perm], reward[perm], agg=agg),
            treepo_advantages(ancestors, reward, agg=agg)[perm],
        )
    # Another node order (relabelled nodes) gives each leaf path the same advantage.
    perm = torch.randperm(len(forest.parent), generator=torch.Generator().manual_seed(seed + 1))
    shuffled = relabel(forest, perm)
    new_leaves, new_ancestors = leaf_ancestors(shuffled.parent, shuffled.depth)
    old_labels = torch.where(new_ancestors >= 0, perm[new_ancestors.clamp_min(0)], -1)
    expected = dict(
        zip(map(tuple, ancestors.tolist()), treepo_advantages(ancestors, reward).tolist(), strict=True)
    )
    got = dict(
        zip(
            map(tuple, old_labels.tolist()),
            treepo_advantages(new_ancestors, shuffled.reward[new_leaves]).tolist(),
            strict=True,
        )
    )
    assert got.keys() == expected.keys()
    for path, value in expected.items():
        assert got[path] == pytest.approx(value, abs=1e-12)


@given(st.integers(0, 2**32 - 1), st.booleans())
@settings(max_examples=60, deadline=None)
def test_treepo_normalize_matches_reference_and_whitens_tokens(seed, center):
    rng = random.Random(seed)
    n_leaves = rng.randint(1, 8)
    leaf_adv = torch.tensor(
        [rng.choice([0.0, 0.5, -1 / 3, rng.uniform(-1, 1)]) for _ in range(n_leaves)], dtype=F64
    )
    n_tokens = torch.tensor([rng.randint(0, 5) for _ in range(n_leaves)])
    out = treepo_normalize(leaf_adv, n_tokens, center=center)
    expected = tree_reference.treepo_normalize(leaf_adv.tolist(), n_tokens.tolist(), center=center)
    torch.testing.assert_close(out, torch.tensor(expected, dtype=F64), atol=1e-9, rtol=1e-9)
    tokens = out.repeat_interleave(n_tokens)
    if center and tokens.numel() and tokens.abs().max() > 0:
        torch.testing.assert_close(tokens.mean(), torch.tensor(0.0, dtype=F64), atol=1e-12, rtol=0)
        torch.testing.assert_close(tokens.std(), torch.tensor(1.0, dtype=F64))


# ---------------------------------------------------------------- TreePO: branching and fallback


def test_treepo_branching_example_progression():
    # w = 16, first fork 2, nobody finishes: B = min(16, 2A) → 2, 4, 8, 16 paths, then chains.
    active, history = 2, []
    for _ in range(5):
        kids = treepo_children(torch.tensor([active]), torch.tensor([0]), torch.tensor([0]), 16)
        history.append(kids.tolist())
        active = int(kids.sum())
    assert history == [[2, 2], [2] * 4, [2] * 8, [1] * 16, [1] * 16]
    # 3 of the 16 finish: A = 13, W = 3, B = max(13, min(13, 6 + 26)) = 13: still chains.
    assert treepo_children(torch.tensor([13]), torch.tensor([3]), torch.tensor([3]), 16).tolist() == [1] * 13


def test_treepo_branching_remainder_and_budget():
    kids = treepo_children(
        torch.tensor([3, 5, 0, 1]), torch.tensor([1, 0, 2, 0]), torch.tensor([1, 9, 4, 15]), 16
    )
    # Prompt 0: B = max(3, min(15, 2 + 6)) = 8 → 2, 2, 4 (remainder to the last).
    # Prompt 1: B = max(5, min(7, 10)) = 7 → 1, 1, 1, 1, 3.  Prompt 2: no active path, no children.
    # Prompt 3: B = max(1, min(1, 2)) = 1.
    assert kids.tolist() == [2, 2, 4, 1, 1, 1, 1, 3, 1]


@given(st.integers(0, 2**32 - 1), st.integers(1, 20))
@settings(max_examples=60, deadline=None)
def test_treepo_children_match_reference(seed, width):
    rng = random.Random(seed)
    states = []
    for _ in range(rng.randint(1, 5)):
        finished_total = rng.randint(0, width)
        states.append(
            (rng.randint(0, width - finished_total), rng.randint(0, finished_total), finished_total)
        )
    active, finished_now, finished_total = (torch.tensor(column) for column in zip(*states, strict=True))
    kids = treepo_children(active, finished_now, finished_total, width)
    expected = [k for state in states for k in tree_reference.treepo_children(*state, width)]
    assert kids.tolist() == expected
    assert (kids >= 1).all()


def test_treepo_children_reject_impossible_states():
    with pytest.raises(ValueError, match="prompt 1"):
        treepo_children(torch.tensor([2, 10]), torch.tensor([0, 0]), torch.tensor([0, 7]), 16)
    with pytest.raises(ValueError, match="prompt 0"):
        treepo_children(torch.tensor([2]), torch.tensor([3]), torch.tensor([1]), 16)


def test_treepo_restarts_hand_example():
    gen = torch.Generator().manual_seed(0)
    # Prompt 0: budget 5 over candidates of 3, 1, 4 segments → 2, 2, 1 copies; the 1-segment path can only
    # restart from the prompt (cut 0). Prompt 1: budget 3, no candidate → 2 from the prompt. Prompt 2:
    # budget 0 → nothing even with a candidate. Prompt 3: budget 3 over 4 candidates → 2, 1, 0, 0.
    n_segments = torch.tensor([3, 2, 1, 4, 5, 6, 2, 3])
    prompt = torch.tensor([0, 2, 0, 0, 3, 3, 3, 3])
    rows_prompt, source, cut = treepo_restarts(n_segments, prompt, torch.tensor([5, 3, 0, 3]), gen)
    assert rows_prompt.tolist() == [0, 0, 0, 0, 0, 1, 1, 3, 3, 3]
    assert source.tolist() == [0, 0, 2, 2, 3, -1, -1, 4, 4, 5]
    assert cut[2:4].tolist() == [0, 0] and cut[5:7].tolist() == [0, 0]
    assert cut[0] == cut[1] and cut[7] == cut[8]  # copies share their cut
    assert ((cut >= 0) & (cut < torch.where(source >= 0, n_segments[source.clamp_min(0)], 1))).all()


@given(st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_treepo_restarts_match_reference(seed):
    rng = random.Random(seed)
    n_prompts = rng.randint(1, 4)
    n_candidates = rng.randint(0, 8)
    n_segments = torch.tensor([rng.randint(1, 6) for _ in range(n_candidates)], dtype=torch.long)
    prompt = torch.tensor([rng.randrange(n_prompts) for _ in range(n_candidates)], dtype=torch.long)
    budget = torch.tensor([rng.randint(0, 9) for _ in range(n_prompts)])
    fork = rng.choice([1, 2, 3])
    got = treepo_restarts(n_segments, prompt, budget, torch.Generator().manual_seed(seed), fork=fork)
    uniforms = torch.rand(n_candidates, generator=torch.Generator().manual_seed(seed), dtype=F64).tolist()
    expected = []
    for p in range(n_prompts):
        mine = [k for k in range(n_candidates) if prompt[k] == p]
        rows = tree_reference.treepo_restarts(
            [int(n_segments[k]) for k in mine], [uniforms[k] for k in mine], int(budget[p]), fork
        )
        expected += [(p, mine[k] if k >= 0 else -1, c) for k, c in rows]
    assert list(zip(*(t.tolist() for t in got), strict=True)) == expected


def test_treepo_restart_cuts_are_uniform():
    # 4,000 candidates of 4 segments: each cut in {0, 1, 2, 3} about 1,000 times (±5 σ ≈ ±140).
    n = 4000
    _, _, cut = treepo_restarts(
        torch.full((n,), 4),
        torch.zeros(n, dtype=torch.long),
        torch.tensor([2 * n]),
        torch.Generator().manual_seed(1),
        fork=1,
    )
    counts = torch.bincount(cut, minlength=4)
    assert counts.numel() == 4 and ((counts - n / 4).abs() < 140).all(), counts


@given(st.integers(0, 2**32 - 1))
@settings(max_examples=30, deadline=None)
def test_treepo_sampling_simulation_fills_the_width(seed):
    # Counts-only simulation of a TreePO rollout (width 8, depth limit 5, random finishes): the branching
    # rule and the fallback never exceed the width (treepo_children would raise) and end with w leaves each.
    rng = random.Random(seed)
    width, depth_limit, n_prompts = 8, 5, 3
    gen = torch.Generator().manual_seed(seed)
    # Active paths as (prompt, segments so far); finished paths' segment counts per prompt.
    first = treepo_restarts(
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0, dtype=torch.long),
        torch.full((n_prompts,), width),
        gen,
    )
    active = [(int(p), int(c)) for p, c in zip(first[0], first[2], strict=True)]
    finished: list[list[int]] = [[] for _ in range(n_prompts)]
    for _ in range(100):
        if not active:
            break
        per_prompt, finished_now = [0] * n_prompts, [0] * n_prompts
        still_active = []
        for prompt, segments in sorted(active):
            segments += 1  # every active path samples one more segment
            if segments == depth_limit or rng.random() < 0.3:
                finished[prompt].append(segments)
                finished_now[prompt] += 1
            else:
                still_active.append((prompt, segments))
                per_prompt[prompt] += 1
        kids = treepo_children(
            torch.tensor(per_prompt),
            torch.tensor(finished_now),
            torch.tensor([len(f) for f in finished]),
            width,
        )
        active = [path for path, k in zip(still_active, kids.tolist(), strict=True) for _ in range(k)]
        budget = [width - len(finished[q]) if per_prompt[q] == 0 else 0 for q in range(n_prompts)]
        candidates = [(q, s) for q in range(n_prompts) for s in finished[q]]
        restarted = treepo_restarts(
            torch.tensor([s for _, s in candidates], dtype=torch.long),
            torch.tensor([q for q, _ in candidates], dtype=torch.long),
            torch.tensor(budget),
            gen,
        )
        active += [(int(p), int(c)) for p, c in zip(restarted[0], restarted[2], strict=True)]
    assert not active and [len(f) for f in finished] == [width] * n_prompts


# ---------------------------------------------------------------- validation


def test_treepo_rejects_bad_paths():
    reward = torch.zeros(2)
    for bad, match in [
        ([[0, -1, 2], [0, 1, 3]], "row 0"),  # a gap
        ([[-1, 1], [0, 2]], "row 0"),  # no root
        ([[0, 1], [0, 1]], "row 0"),  # the same leaf twice
        ([[0, 1, -1], [0, 1, 2]], "row 0"),  # a leaf on another leaf's path
        ([[0, 1], [5, 1]], "column 1"),  # one prefix label under two roots
    ]:
        with pytest.raises(ValueError, match=match):
            treepo_advantages(torch.tensor(bad), reward)
    with pytest.raises(ValueError, match="agg"):
        treepo_advantages(torch.tensor([[0, 1], [0, 2]]), reward, agg="max")
    with pytest.raises(ValueError, match="n_tokens"):
        treepo_normalize(torch.zeros(2), torch.tensor([1, -1]))
