"""The methods, as one table: each `algo.algorithm` is one frozen `Method` in METHODS, and the stages, the
CLI and the science bench read it; no stage compares method names. verl's estimator registry is the model.

The table sits below the stages: its entries are data and pure rules over update k's inputs
(`inputs.UpdateInputs`, which the stages provide from the store), so it imports nothing above the config,
the maths and the engines' data types.

Adding a method (docs/DESIGN.md, "Adding a method"): its maths in probepo/algo with a loop reference in
tests/unit, one entry here, its name in `probepo.config.algo.Algorithm` (and any check of its fields in
`probepo.config.algo.METHOD_CHECKS`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from probepo.methods import advantages, pivots, trees
from probepo.methods.advantages import AdvantageRule
from probepo.methods.inputs import TrainingRows, UpdateInputs
from probepo.methods.pivots import PivotRule
from probepo.methods.trees import TreeGrower

RowRule = Callable[[UpdateInputs], TrainingRows]
"""(update k's inputs) -> the rows that score, advantage and optimize work on."""


def response_rows(inputs: UpdateInputs) -> TrainingRows:
    """One row per response (a TreePO leaf's response is its whole path)."""
    return TrainingRows(inputs.rollouts.prompts, inputs.rollouts.responses)


@dataclass(frozen=True)
class Method:
    """What one method does at each stage of an update."""

    label: str
    """Its name in reports and tables."""
    summary: str
    """One line: what it computes."""
    advantage: AdvantageRule
    """advantage: the training rows' token advantages (and loss mask)."""
    tree: TreeGrower | None = None
    """sample: grows a tree per prompt (its leaves the responses); None samples G independent responses."""
    pivots: PivotRule = pivots.no_pivots
    """select: where probes start (probe continues each pivot's prefix); no_pivots probes nothing."""
    shrinks_values: bool = True
    """probe: prefix values shrunk toward the group mean with pseudo-count κ (False: plain Monte-Carlo)."""
    rows: RowRule = response_rows
    """score, advantage and optimize: the training rows (score computes their old log-probs and
    entropies)."""

    @property
    def probes(self) -> bool:
        """Whether the method continues prefixes (select places pivots, probe samples from them)."""
        return self.pivots is not pivots.no_pivots


METHODS: dict[str, Method] = {
    "grpo": Method(
        "GRPO",
        "one group-normalised advantage per response, on every token",
        advantages.redistributed,
    ),
    "probepo": Method(
        "ProbePO",
        "sparse entropy-selected probes redistribute each response's GRPO advantage across its tokens",
        advantages.redistributed,
        pivots=pivots.budgeted_pivots,
    ),
    "vineppo": Method(
        "VinePPO-dense",
        "every step boundary probed, plain Monte-Carlo values, whitened, no GRPO term",
        advantages.dense_monte_carlo,
        pivots=pivots.every_boundary,
        shrinks_values=False,
    ),
    "rloo": Method(
        "RLOO",
        "reward minus the mean of the group's other rewards, on every token",
        advantages.leave_one_out,
    ),
    "spo_tree": Method(
        "SPO-tree",
        "a fixed-branching tree per prompt, each edge trained on its value difference",
        advantages.spo_tree,
        tree=trees.grow_spo_tree,
        rows=trees.edge_rows,
    ),
    "treepo": Method(
        "TreePO",
        "an adaptive tree per prompt, each leaf path trained on its nested-subgroup advantage",
        advantages.treepo,
        tree=trees.grow_treepo,
    ),
}


def method_for(name: str) -> Method:
    """The method named `name`; an unknown name is refused, naming the choices."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}: choose one of {', '.join(METHODS)}") from None
