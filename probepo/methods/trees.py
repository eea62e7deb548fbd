"""Tree sampling for the tree baselines (BASELINES.md): SPO-tree's levels and TreePO's adaptive steps, grown
on the engine's prefix forking (`continue_from` encodes a prefix once and forks it into n continuations),
and SPO-tree's training rows (one per edge). Pure: the engine is a `Sample` callable the sample stage gives.

A tree per prompt; every non-root node is one segment of at most M tokens continuing its parent's prefix.
Each engine call is one level (SPO-tree) or one step and child count (TreePO) and commits its chunks as
shards of its own sub-stage, so a preempted sample stage replays the calls it finished from the store and
resumes the one it was in (probepo.stages.shards). The trees are committed with the rollouts (`tree.parquet`,
one row per node); the rollouts hold one row per leaf, its response the whole path.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from probepo.algo.spo_tree import spo_children
from probepo.algo.treepo import treepo_children, treepo_restarts
from probepo.config.algo import AlgoConfig
from probepo.engines.base import Completion
from probepo.methods.inputs import TrainingRows, UpdateInputs

Sample = Callable[[str, list[list[int]], int, list[int]], list[list[Completion]]]
"""An engine call (name, prefixes, n, max_new_tokens per prefix) -> n completions of each prefix; the name
is unique within the update and names the call's shards."""
TreeGrower = Callable[[AlgoConfig, "Forest", Sample, int], None]
"""(the run's algo config, the update's forest of roots, the engine call, the sample stage's seed for the
tree's own draws) -> None: grows every prompt's tree in place."""

TREEPO_FORK = 2
"""TreePO's fixed_step_width (the 2F + 2A of its branching rule and the copies per fallback candidate)."""

CUT = "cut"
"""A segment stopped at M tokens with room left: it continues at the next level or step."""


@dataclass
class Forest:
    """The trees of one update, in probepo.algo.tree's flat representation; node p < P is prompt p's root,
    the others follow in the order they were sampled."""

    prompts: list[list[int]]
    budget: list[int]
    """Response tokens each prompt's paths may have (the run's response budget)."""
    parent: list[int] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    group: list[int] = field(default_factory=list)
    segment: list[list[int]] = field(default_factory=list)
    finish: list[str] = field(default_factory=list)
    """"" at roots; `cut`, or a leaf's `stop` / `length` (the response budget or the depth limit)."""

    def __post_init__(self) -> None:
        for index in range(len(self.prompts)):
            self._add(-1, index, [], "")

    def _add(self, parent: int, group: int, segment: list[int], finish: str) -> int:
        self.parent.append(parent)
        self.depth.append(0 if parent < 0 else self.depth[parent] + 1)
        self.group.append(group)
        self.segment.append(segment)
        self.finish.append(finish)
        return len(self.parent) - 1

    def path(self, node: int) -> list[int]:
        """The response tokens from the root to the end of `node`'s segment."""
        segments = []
        while node >= 0:
            segments.append(self.segment[node])
            node = self.parent[node]
        return [token for segment in reversed(segments) for token in segment]

    def grow(
        self, sample: Sample, name: str, parents: list[int], n: int, segment_tokens: int, *, last: bool
    ) -> list[int]:
        """n children of each of `parents` (one engine call), each of at most `segment_tokens` tokens
        (`last`: to the response budget); returns the new nodes, each parent's n in a row."""
        paths = [self.path(node) for node in parents]
        rooms = [self.budget[self.group[node]] - len(path) for node, path in zip(parents, paths, strict=True)]
        limits = [room if last else min(segment_tokens, room) for room in rooms]
        prefixes = [self.prompts[self.group[node]] + path for node, path in zip(parents, paths, strict=True)]
        results = sample(name, prefixes, n, limits)
        children = []
        for node, room, completions in zip(parents, rooms, results, strict=True):
            for completion in completions:
                cut = completion.finish_reason == "length" and len(completion.ids) < room
                finish = CUT if cut else completion.finish_reason
                children.append(self._add(node, self.group[node], completion.ids, finish))
        return children

    def leaves(self) -> list[int]:
        """Leaf nodes by prompt, then in sampling order (the rollouts' row order)."""
        has_child = set(self.parent)
        leaves = [
            node for node in range(len(self.parent)) if self.parent[node] >= 0 and node not in has_child
        ]
        return sorted(leaves, key=lambda node: (self.group[node], node))

    def table(self) -> dict[str, list]:
        """One row per node: its tree, parent and depth, its rollout row (leaves; -1 elsewhere), and its
        segment as a span [start, end) of the response of `span_row`, the first rollout row below it."""
        leaves = self.leaves()
        row = {node: index for index, node in enumerate(leaves)}
        span_row = [-1] * len(self.parent)
        for index, leaf in enumerate(leaves):
            node = leaf
            while node >= 0 and span_row[node] < 0:
                span_row[node] = index
                node = self.parent[node]
        ends: list[int] = []  # a parent precedes its children: its end is known first
        for parent, segment in zip(self.parent, self.segment, strict=True):
            ends.append((ends[parent] if parent >= 0 else 0) + len(segment))
        return {
            "group": self.group,
            "parent": self.parent,
            "depth": self.depth,
            "row": [row.get(node, -1) for node in range(len(self.parent))],
            "span_row": span_row,
            "start": [end - len(segment) for end, segment in zip(ends, self.segment, strict=True)],
            "end": ends,
            "finish": self.finish,
        }


def spo_tree(forest: Forest, sample: Sample, algo: AlgoConfig) -> None:
    """SPO-tree sampling into `forest` (BASELINES.md §SPO-tree 1–2): level by level, every node cut at M
    tokens gets b_{ℓ+1} children; stopped nodes and the last level are leaves."""
    branching = algo.spo_branching
    frontier = list(range(len(forest.prompts)))
    for level in range(len(branching)):
        depth = torch.tensor([forest.depth[node] for node in frontier], dtype=torch.long)
        stopped = torch.tensor([forest.finish[node] not in ("", CUT) for node in frontier])
        counts = spo_children(depth, stopped, branching)
        frontier = [node for node, count in zip(frontier, counts.tolist(), strict=True) if count > 0]
        if not frontier:
            break
        frontier = forest.grow(
            sample,
            f"level-{level + 1:02d}",
            frontier,
            branching[level],
            algo.spo_segment_tokens,
            last=level == len(branching) - 1,
        )


def treepo(forest: Forest, sample: Sample, algo: AlgoConfig, generator: torch.Generator) -> None:
    """TreePO sampling into `forest` (BASELINES.md §TreePO 1–4): the first step forks each prompt into
    `first_fork` paths; after each step the branching rule spreads the prompt's children over its active
    paths, and a prompt left with no active path and fewer than `width` leaves restarts from a finished
    path cut at a random segment boundary (`generator` draws the cuts)."""
    n_prompts = len(forest.prompts)
    requests = [(root, algo.treepo_first_fork) for root in range(n_prompts)]
    finished: list[list[int]] = [[] for _ in range(n_prompts)]
    step = 0
    while requests:
        step += 1
        new: list[int] = []
        by_count: dict[int, list[int]] = {}
        for node, count in requests:
            by_count.setdefault(count, []).append(node)
        for count, parents in sorted(by_count.items()):
            new += forest.grow(
                sample, f"step-{step:02d}-n{count}", parents, count, algo.treepo_segment_tokens, last=False
            )
        active: list[list[int]] = [[] for _ in range(n_prompts)]
        now = [0] * n_prompts
        for node in sorted(new):
            if forest.finish[node] == CUT and forest.depth[node] == algo.treepo_depth:
                forest.finish[node] = "length"  # the depth limit ends the path
            if forest.finish[node] == CUT:
                active[forest.group[node]].append(node)
            else:
                finished[forest.group[node]].append(node)
                now[forest.group[node]] += 1
        counts = treepo_children(
            torch.tensor([len(a) for a in active]),
            torch.tensor(now),
            torch.tensor([len(f) for f in finished]),
            algo.treepo_width,
            fork=TREEPO_FORK,
        ).tolist()
        paths = [node for prompt_paths in active for node in prompt_paths]
        requests = list(zip(paths, counts, strict=True))
        requests += _restarts(forest, active, finished, algo.treepo_width, generator)


def _restarts(
    forest: Forest, active: list[list[int]], finished: list[list[int]], width: int, generator: torch.Generator
) -> list[tuple[int, int]]:
    """TreePO's fallback (§TreePO 4) as (parent node, copies) requests: for each prompt with no active path
    and fewer than `width` leaves, copies of its finished paths cut at random segment boundaries."""
    budget = [
        0 if paths or len(done) >= width else width - len(done)
        for paths, done in zip(active, finished, strict=True)
    ]
    if not any(budget):
        return []
    candidates = [
        (prompt, leaf) for prompt, leaves in enumerate(finished) if budget[prompt] for leaf in leaves
    ]
    prompts, sources, cuts = treepo_restarts(
        torch.tensor([forest.depth[leaf] for _, leaf in candidates], dtype=torch.long),
        torch.tensor([prompt for prompt, _ in candidates], dtype=torch.long),
        torch.tensor(budget, dtype=torch.long),
        generator,
        fork=TREEPO_FORK,
    )
    parents = []
    for prompt, source, cut in zip(prompts.tolist(), sources.tolist(), cuts.tolist(), strict=True):
        node = prompt if source < 0 else candidates[source][1]
        while forest.depth[node] > cut:  # up to the prefix of `cut` segments
            node = forest.parent[node]
        parents.append(node)
    return sorted(Counter(parents).items())


def grow_spo_tree(algo: AlgoConfig, forest: Forest, sample: Sample, seed: int) -> None:
    """SPO-tree's levels (BASELINES.md §SPO-tree 1–2); it draws nothing of its own."""
    spo_tree(forest, sample, algo)


def grow_treepo(algo: AlgoConfig, forest: Forest, sample: Sample, seed: int) -> None:
    """TreePO's adaptive steps (§TreePO 1–4), its restarts' cuts drawn from `seed`."""
    treepo(forest, sample, algo, torch.Generator().manual_seed(seed))


def edge_rows(inputs: UpdateInputs) -> TrainingRows:
    """SPO-tree's rows: one per tree edge in ascending node order, its prompt the prefix above the node
    (the prompt and the segments before it), its response the node's segment."""
    tree, rollouts = inputs.tree, inputs.rollouts
    prompts, responses = [], []
    for node in (tree["parent"] >= 0).nonzero().squeeze(1).tolist():
        row, start, end = (int(tree[name][node]) for name in ("span_row", "start", "end"))
        prompts.append(rollouts.prompts[row] + rollouts.responses[row][:start])
        responses.append(rollouts.responses[row][start:end])
    return TrainingRows(prompts, responses)
