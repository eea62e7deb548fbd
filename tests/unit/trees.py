"""Random and hand-built trees for the tree-baseline tests (probepo.algo.tree's representation)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

F64 = torch.float64


@dataclass
class Forest:
    parent: torch.Tensor  # [Nn] long
    depth: torch.Tensor  # [Nn] long
    reward: torch.Tensor  # [Nn] float64, random junk at interior nodes

    def trees(self) -> list[list[int]]:
        """The node indices of each tree (ascending)."""
        parent = self.parent.tolist()

        def root(node: int) -> int:
            while parent[node] >= 0:
                node = parent[node]
            return node

        by_root: dict[int, list[int]] = {}
        for node in range(len(parent)):
            by_root.setdefault(root(node), []).append(node)
        return list(by_root.values())

    def local(self, nodes: list[int]) -> tuple[list[int], list[float]]:
        """One tree as the reference's (parent, reward) lists, nodes renumbered in the order given."""
        position = {node: k for k, node in enumerate(nodes)}
        parent = [position[p] if p >= 0 else -1 for p in self.parent[nodes].tolist()]
        return parent, self.reward[nodes].tolist()

    def path(self, node: int) -> list[int]:
        """Node indices from the root to `node`."""
        path = [node]
        while self.parent[path[-1]] >= 0:
            path.append(int(self.parent[path[-1]]))
        return path[::-1]


def random_forest(seed: int, *, n_trees: int, max_depth: int, max_children: int) -> Forest:
    """Trees of random depths and fan-outs (single-child chains, early leaves), nodes shuffled together."""
    rng = random.Random(seed)
    parent: list[int] = []
    depth: list[int] = []
    for _ in range(n_trees):
        parent.append(-1)
        depth.append(0)
        frontier = [len(parent) - 1]
        tree_depth = rng.randint(1, max_depth)
        while frontier:
            node = frontier.pop()
            if depth[node] == tree_depth or (depth[node] > 0 and rng.random() < 0.3):
                continue  # a leaf: stopped early or at the last level
            for _ in range(rng.randint(1, max_children)):
                parent.append(node)
                depth.append(depth[node] + 1)
                frontier.append(len(parent) - 1)
    order = list(range(len(parent)))
    rng.shuffle(order)
    new_index = {old: new for new, old in enumerate(order)}
    binary = rng.random() < 0.6
    return Forest(
        parent=torch.tensor([new_index[parent[old]] if parent[old] >= 0 else -1 for old in order]),
        depth=torch.tensor([depth[old] for old in order]),
        reward=torch.tensor(
            [float(rng.random() < 0.5) if binary else rng.random() for _ in order], dtype=F64
        ),
    )


@st.composite
def forests(draw: st.DrawFn, *, max_depth: int = 4) -> Forest:
    return random_forest(
        draw(st.integers(0, 2**32 - 1)),
        n_trees=draw(st.integers(1, 4)),
        max_depth=draw(st.integers(1, max_depth)),
        max_children=draw(st.integers(1, 4)),
    )


def depth_one_forest(rewards: list[list[float]]) -> Forest:
    """One root per group with its rewards as leaves at depth 1, roots first."""
    n_roots = len(rewards)
    parent = [-1] * n_roots + [g for g, group in enumerate(rewards) for _ in group]
    depth = [0] * n_roots + [1] * (len(parent) - n_roots)
    reward = [0.0] * n_roots + [r for group in rewards for r in group]
    return Forest(torch.tensor(parent), torch.tensor(depth), torch.tensor(reward, dtype=F64))


def relabel(forest: Forest, perm: torch.Tensor) -> Forest:
    """The same trees with node k of the result being node perm[k] of `forest`."""
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(len(perm))
    parent = forest.parent[perm]
    return Forest(
        torch.where(parent >= 0, inverse[parent.clamp_min(0)], -1), forest.depth[perm], forest.reward[perm]
    )
