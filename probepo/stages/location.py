"""Where policy k is, for what a stage needs of it: the one decision of the policy's journey (policy.py acts
on it). Pure: the caller gathers the facts — what the resident engines hold (free), then, only where they
do not serve, what the store holds of policy k (committed.py: `committed_policy`) — and `locate` answers.

    need       resident engines            checkpoint k               else
    TRAIN      trainer on k with optimizer  full: load it              replay from c
    SCORE      trainer on k                 full or weights: weights   replay from c
    GENERATE   generator on k, else trainer full or weights: weights   replay from c

c is the latest full checkpoint <= k; with none, policy k is nowhere (retention pruned what rebuilt it).
A record-only checkpoint (retention emptied it) is no source of weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from probepo.store.retention import Holds


class Need(Enum):
    """What a stage needs of policy k."""

    TRAIN = "its weights and optimizer state, on a trainer"
    """Optimize: the trainer that makes policy k + 1."""
    SCORE = "its weights, on a trainer"
    """Score's forward pass: a trainer without optimizer state will do."""
    GENERATE = "its weights, on a generator"
    """Sample, probe and evaluate."""


class Engine(Enum):
    TRAINER = "trainer"
    GENERATOR = "generator"


@dataclass(frozen=True)
class Resident:
    """What the runner's resident engines hold: the policy of each (None: no such engine, or one that holds
    no policy: optimize changes the trainer in place until it has made k + 1)."""

    trainer: int | None = None
    trainer_optimizer_state: bool = False
    """The resident trainer holds its optimizer state (False: loaded with the weights alone, to score)."""
    generator: int | None = None
    """None also while the generator sleeps without its weights (vLLM's sleep level 2 on a GPU discards
    them): asleep, it holds no policy until one is handed to it. One whose sleep kept them (the torch and
    Hugging Face engines, vLLM on CPU) still holds its policy, which it serves once awake."""


@dataclass(frozen=True)
class Committed:
    """What the store holds of policy k."""

    checkpoint: Holds | None
    """What checkpoint k still holds after retention (None: not committed, as between full checkpoints)."""
    latest_full: int | None
    """The latest update c <= k whose checkpoint is full (None: none is)."""


@dataclass(frozen=True)
class InEngine:
    """Policy k is in a resident engine: use it (a generator takes a trainer's weights in memory)."""

    engine: Engine
    optimizer_state: bool


@dataclass(frozen=True)
class InCheckpoint:
    """Policy k's checkpoint serves: fetch it with its optimizer state, or its weights alone."""

    optimizer_state: bool


@dataclass(frozen=True)
class ByReplay:
    """Policy k is rebuilt: checkpoint `full` (c), then the optimize stages of updates c .. k - 1 replayed."""

    full: int


@dataclass(frozen=True)
class Nowhere:
    """No engine holds policy k, its checkpoint holds no weights, and no full checkpoint <= k is left."""


@dataclass(frozen=True)
class AskTheStore:
    """The resident engines do not serve and the store's facts were not given: gather them, locate again."""


Location = InEngine | InCheckpoint | ByReplay | Nowhere | AskTheStore


def locate(k: int, need: Need, resident: Resident, committed: Committed | None) -> Location:
    """Where policy k is for `need`: a resident engine first (it costs nothing), then checkpoint k, then a
    replay from the latest full checkpoint. `committed` None: the store not read (AskTheStore where the
    resident engines do not serve)."""
    if need is Need.GENERATE and resident.generator == k:
        return InEngine(Engine.GENERATOR, optimizer_state=False)
    if resident.trainer == k and (need is not Need.TRAIN or resident.trainer_optimizer_state):
        return InEngine(Engine.TRAINER, resident.trainer_optimizer_state)
    if committed is None:
        return AskTheStore()
    if need is Need.TRAIN and committed.checkpoint == "full":
        return InCheckpoint(optimizer_state=True)
    if need is not Need.TRAIN and committed.checkpoint in ("full", "weights"):
        return InCheckpoint(optimizer_state=False)
    if committed.latest_full is None:
        return Nowhere()
    return ByReplay(committed.latest_full)
