"""The tree baselines' glue (BASELINES.md): how each grows its trees in the sample stage, and SPO-tree's
training rows (one per edge)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from probepo.schedule import Stage
from probepo.stages.common import Rollouts, TrainingRows, read_tree
from probepo.stages.context import StageContext
from probepo.stages.trees import Forest, Sample, spo_tree, treepo

TreeGrower = Callable[[StageContext, Forest, Sample], None]
"""(context of update k, the update's forest of roots, the engine call) -> None: grows every prompt's tree
in place."""


def grow_spo_tree(ctx: StageContext, forest: Forest, sample: Sample) -> None:
    """SPO-tree's levels (BASELINES.md §SPO-tree 1–2)."""
    spo_tree(forest, sample, ctx.config.algo)


def grow_treepo(ctx: StageContext, forest: Forest, sample: Sample) -> None:
    """TreePO's adaptive steps (§TreePO 1–4), its restarts' cuts drawn from the stage's seed."""
    treepo(forest, sample, ctx.config.algo, torch.Generator().manual_seed(ctx.seed(Stage.SAMPLE, "restarts")))


def edge_rows(ctx: StageContext, rollouts: Rollouts) -> TrainingRows:
    """SPO-tree's rows: one per tree edge in ascending node order, its prompt the prefix above the node
    (the prompt and the segments before it), its response the node's segment."""
    tree = read_tree(ctx)
    prompts, responses = [], []
    for node in (tree["parent"] >= 0).nonzero().squeeze(1).tolist():
        row, start, end = (int(tree[name][node]) for name in ("span_row", "start", "end"))
        prompts.append(rollouts.prompts[row] + rollouts.responses[row][:start])
        responses.append(rollouts.responses[row][start:end])
    return TrainingRows(prompts, responses)
