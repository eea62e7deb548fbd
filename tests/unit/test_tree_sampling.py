"""probepo.methods.trees: SPO-tree's and TreePO's tree growth (BASELINES.md §SPO-tree 1–2, §TreePO 1–4) over
a fake engine whose continuations stop early at random, so every branch of the samplers is exercised."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from probepo.config import AlgoConfig
from probepo.engines.base import Completion
from probepo.methods.trees import CUT, Forest, spo_tree, treepo

EOS = 0


class FakeEngine:
    """n continuations of each prefix, each stopping (EOS) after a random length or running to its limit;
    records every call and every token it generated."""

    def __init__(self, seed: int, stop_chance: float) -> None:
        self.rng = random.Random(seed)
        self.stop_chance = stop_chance
        self.calls: list[tuple[str, int, list[int]]] = []
        self.generated = 0

    def __call__(
        self, name: str, prefixes: list[list[int]], n: int, limits: list[int]
    ) -> list[list[Completion]]:
        assert all(limit >= 1 for limit in limits), (name, limits)  # no call asks for an empty segment
        assert name not in {call[0] for call in self.calls}  # names are unique: they name the shards
        self.calls.append((name, n, limits))
        results = []
        for limit in limits:
            samples = []
            for _ in range(n):
                if self.rng.random() < self.stop_chance:
                    length = self.rng.randint(1, limit)
                    ids = [self.rng.randint(1, 9) for _ in range(length - 1)] + [EOS]
                    samples.append(Completion(ids, "stop"))
                else:
                    samples.append(Completion([self.rng.randint(1, 9) for _ in range(limit)], "length"))
                self.generated += len(samples[-1].ids)
            results.append(samples)
        return results


def _children(forest: Forest) -> Counter:
    return Counter(p for p in forest.parent if p >= 0)


def _common_checks(forest: Forest, engine: FakeEngine) -> None:
    leaves = set(forest.leaves())
    assert sum(map(len, forest.segment)) == engine.generated  # every sampled token in one segment, once
    for node, parent in enumerate(forest.parent):
        if parent < 0:
            continue
        assert (forest.finish[node] == CUT) == (node not in leaves)  # cut segments continue, others end
        assert len(forest.path(node)) <= forest.budget[forest.group[node]]
    for leaf in leaves:
        assert forest.finish[leaf] in ("stop", "length")


@given(st.integers(0, 2**32 - 1), st.floats(0.0, 0.6), st.integers(6, 40))
@settings(max_examples=60, deadline=None)
def test_spo_tree_expands_every_cut_node_by_its_levels_branching(seed, stop_chance, budget):
    algo = AlgoConfig(algorithm="spo_tree", spo_branching=(3, 2, 2), spo_segment_tokens=5)
    forest = Forest([[1, 2], [3]], [budget, budget])
    engine = FakeEngine(seed, stop_chance)
    spo_tree(forest, engine, algo)
    _common_checks(forest, engine)
    children = _children(forest)
    for node in range(len(forest.parent)):
        depth, expanded = forest.depth[node], children.get(node, 0)
        if depth == 0:
            assert expanded == 3
        elif forest.finish[node] == CUT:
            assert depth < 3 and expanded == algo.spo_branching[depth]
            assert len(forest.segment[node]) == 5  # cut exactly at M
        else:
            assert expanded == 0
    assert max(forest.depth) <= 3
    assert [call[1] for call in engine.calls] == [3, 2, 2][: len(engine.calls)]  # one call per level
    for group in range(2):
        assert len([leaf for leaf in forest.leaves() if forest.group[leaf] == group]) <= 12


@given(st.integers(0, 2**32 - 1), st.floats(0.0, 0.7), st.integers(3, 30), st.integers(2, 9))
@settings(max_examples=80, deadline=None)
def test_treepo_fills_each_prompts_width_within_the_depth(seed, stop_chance, budget, width):
    algo = AlgoConfig(
        algorithm="treepo", treepo_segment_tokens=3, treepo_depth=4, treepo_width=width, treepo_first_fork=2
    )
    forest = Forest([[1], [2, 3], [4]], [budget] * 3)
    engine = FakeEngine(seed, stop_chance)
    treepo(forest, engine, algo, torch.Generator().manual_seed(seed))
    _common_checks(forest, engine)
    leaves_per_prompt = Counter(forest.group[leaf] for leaf in forest.leaves())
    assert leaves_per_prompt == {0: width, 1: width, 2: width}  # the fallback spends every prompt's budget
    assert max(forest.depth) <= 4
    first = [call for call in engine.calls if call[0].startswith("step-01-")]
    assert [call[1] for call in first] == [2]  # the first step forks each prompt into first_fork paths
    for node in forest.leaves():
        reached_depth = forest.depth[node] == 4
        assert forest.finish[node] == "stop" or reached_depth or len(forest.path(node)) == budget


def test_treepo_restarts_from_a_finished_path_when_every_path_ended_early():
    # every continuation stops at once: 2 leaves after the first step, then restarts (from the prompt, the
    # only segment boundary of a one-segment path) until the width is reached
    algo = AlgoConfig(algorithm="treepo", treepo_segment_tokens=4, treepo_depth=3, treepo_width=6)
    forest = Forest([[1]], [12])
    engine = FakeEngine(0, stop_chance=1.0)
    treepo(forest, engine, algo, torch.Generator().manual_seed(0))
    assert len(forest.leaves()) == 6 and all(forest.parent[leaf] == 0 for leaf in forest.leaves())
    assert [(name, n) for name, n, _ in engine.calls] == [("step-01-n2", 2), ("step-02-n4", 4)]


def test_sampling_is_a_function_of_the_engine_and_the_generator():
    algo = AlgoConfig(algorithm="treepo", treepo_segment_tokens=3, treepo_depth=4, treepo_width=5)
    tables = []
    for _ in range(2):
        forest = Forest([[1], [2]], [10, 10])
        treepo(forest, FakeEngine(7, 0.4), algo, torch.Generator().manual_seed(3))
        tables.append(forest.table())
    assert tables[0] == tables[1]


@pytest.mark.parametrize("algorithm", ["spo_tree", "treepo"])
def test_the_table_locates_every_segment_in_a_response_below_it(algorithm):
    algo = AlgoConfig(
        algorithm=algorithm,
        spo_branching=(2, 2),
        spo_segment_tokens=3,
        treepo_segment_tokens=3,
        treepo_width=4,
    )
    forest = Forest([[1], [2]], [9, 9])
    engine = FakeEngine(11, 0.3)
    if algorithm == "spo_tree":
        spo_tree(forest, engine, algo)
    else:
        treepo(forest, engine, algo, torch.Generator().manual_seed(0))
    table = forest.table()
    responses = [forest.path(leaf) for leaf in forest.leaves()]
    for node in range(len(forest.parent)):
        row, start, end = table["span_row"][node], table["start"][node], table["end"][node]
        assert responses[row][start:end] == forest.segment[node]
        if table["row"][node] >= 0:
            assert responses[table["row"][node]] == forest.path(node)
