"""The science bench's plan: its testbeds, their arms and seeds, and how a (testbed, arm, seed) becomes
a run's config and id. What was stated in advance is in bench/science.py's docstring."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probepo.config import RunConfig
from probepo.methods import method_for
from probepo.presets import load_run_config

ROOT = Path(__file__).resolve().parent.parent
GRPO_HORIZON = 4
"""The GRPO arm trains this many times the updates (ProbePO samples ~3.5× GRPO's tokens per update)."""
PRIMARY = ("modchain-replication", "probepo", "grpo")

ENGINE = "chunk-seeded"
"""The engine the store's runs are measured on: every chunk of generation draws from its own generator,
seeded from (stage seed, chunk index), so its bits do not depend on the number of ranks (issue 27)."""
EARLIER_ENGINE = "carried-generator"
"""The engine of results committed before issue 27 (one generator carried from chunk to chunk): the same
maths, other samples. Arms of the two engines are never compared."""


@dataclass(frozen=True)
class Arm:
    """One arm: overrides of the testbed's preset, and which seeds."""

    name: str
    overrides: dict[str, Any]
    seeds: int
    about: str
    horizon: int = 1
    """Train this many times the testbed's updates (GRPO_HORIZON for the equal-tokens GRPO arm)."""
    first_seed: int = 0
    """Seeds first_seed .. first_seed + seeds - 1 (the replication uses fresh seeds 10-39)."""
    cost: float = 1.0
    """Wall time of a run relative to ProbePO's (measured), so the bench starts the longest first."""
    label: str = ""
    """Its name in tables: the method's label (probepo.methods) unless given."""

    def __post_init__(self) -> None:
        method = method_for(self.overrides.get("algo.algorithm", "probepo"))  # refuses an unknown method
        if not self.label:
            object.__setattr__(self, "label", method.label)

    @property
    def seed_range(self) -> range:
        return range(self.first_seed, self.first_seed + self.seeds)


@dataclass(frozen=True)
class Testbed:
    """A preset plus what every arm on it shares."""

    name: str
    preset: str
    updates: int
    arms: tuple[Arm, ...]
    overrides: dict[str, Any] = field(default_factory=lambda: {"eval.every": 10})


GRPO = {"algo.algorithm": "grpo"}
GRPO_EQUAL_TOKENS = Arm("grpo", GRPO, 10, "GRPO (run to 4× the updates, see above)", GRPO_HORIZON, cost=3.0)
PROBEPO = Arm("probepo", {}, 10, "ProbePO, defaults (5 pivots × 8 continuations, κ 4, λ 1)")
VINEPPO = Arm(
    "vineppo", {"algo.algorithm": "vineppo"}, 10, "every step boundary × 8, MC values, no GRPO", cost=4.0
)
GRPO_G32 = Arm(
    "grpo_g32",
    {**GRPO, "group_size": 32, "optim.minibatch_size": 256},
    10,
    "GRPO with 4× the responses per prompt (≈ ProbePO's tokens), same updates and optimizer steps",
    label="GRPO with G = 32",
)
RLOO = Arm(
    "rloo",
    {"algo.algorithm": "rloo"},
    10,
    "RLOO: each response's reward minus the mean of the others in its group, no std scaling",
    cost=0.6,
)
SPO_TREE = Arm(
    "spo_tree",
    {"algo.algorithm": "spo_tree"},
    10,
    "SPO-tree at the preset's tree (3-2-2 levels of fixed-token segments), diff edge advantages, prob mask",
)
TREEPO = Arm(
    "treepo",
    {"algo.algorithm": "treepo"},
    10,
    "TreePO at the preset's tree (6 segments deep, 8 leaves), nested-subgroup advantages",
)

PLAN = (
    Testbed(
        "modchain",
        "configs/cpu-demo.yaml",
        80,
        (GRPO_EQUAL_TOKENS, PROBEPO, RLOO, VINEPPO, GRPO_G32, SPO_TREE, TREEPO),
    ),
    Testbed(
        "pointer",
        "configs/cpu-pointer.yaml",
        80,
        (GRPO_EQUAL_TOKENS, PROBEPO, RLOO, VINEPPO, SPO_TREE, TREEPO),
    ),
    Testbed(
        "modchain-replication",
        "configs/cpu-demo.yaml",
        80,
        (
            Arm("grpo", GRPO, 30, "GRPO, 80 updates", first_seed=10),
            Arm("probepo", {}, 30, "ProbePO, defaults", first_seed=10),
        ),
    ),
)
PLANNED_EFFECT, PLANNED_SD = 0.012, 0.022
"""The effect (+1.2 points) and SD of paired differences (2.2 points) the replication was sized for."""


def arm_config(testbed: Testbed, arm: Arm, seed: int, store: str) -> RunConfig:
    overrides = {**testbed.overrides, **arm.overrides, "seed": seed, "store": store}
    overrides["num_updates"] = testbed.updates * arm.horizon
    return load_run_config(ROOT / testbed.preset, overrides)


def run_id(testbed: Testbed, arm: Arm, config: RunConfig) -> str:
    recipe = config.recipe_json()
    return f"sci-{testbed.name}-{arm.name}-s{config.seed}-{hashlib.sha256(recipe.encode()).hexdigest()[:8]}"
