"""Where policy k is (probepo/stages/location.py): `locate` over every case, as a table; and the engines that
act on it (PolicyEngines), their transitions on fake engines: what the resident engines serve reads no
store, and a generator asleep without its weights holds no policy (tests/unit/test_generation_phases.py
drives the phases over whole updates)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from probepo.config import RunConfig
from probepo.stages import policy
from probepo.stages.committed import at_update
from probepo.stages.context import StageContext
from probepo.stages.location import (
    AskTheStore,
    ByReplay,
    Committed,
    Engine,
    InCheckpoint,
    InEngine,
    Need,
    Nowhere,
    Resident,
    locate,
)
from probepo.stages.policy import PolicyEngines
from probepo.store import open_store

K = 5
TRAIN, SCORE, GENERATE = Need.TRAIN, Need.SCORE, Need.GENERATE
NONE = Resident()
TRAINER = Resident(trainer=K, trainer_optimizer_state=True)
SCORER = Resident(trainer=K, trainer_optimizer_state=False)
OLD_TRAINER = Resident(trainer=K - 1, trainer_optimizer_state=True)
GENERATOR = Resident(generator=K)
BOTH = Resident(trainer=K, trainer_optimizer_state=True, generator=K)
STALE_GENERATOR = Resident(trainer=K, trainer_optimizer_state=True, generator=K - 1)
ASLEEP = Resident(trainer=K, trainer_optimizer_state=True, generator=None)
"""A generator on policy k asleep without its weights (vLLM's sleep level 2 on a GPU) holds no policy."""
ASLEEP_ALONE = Resident(generator=None)

FULL = Committed("full", K)
WEIGHTS = Committed("weights", 3)
RECORD = Committed("record", 3)
UNCOMMITTED = Committed(None, 3)
PRUNED = Committed("weights", None)
LOST = Committed(None, None)

IN_TRAINER = InEngine(Engine.TRAINER, optimizer_state=True)
IN_SCORER = InEngine(Engine.TRAINER, optimizer_state=False)
IN_GENERATOR = InEngine(Engine.GENERATOR, optimizer_state=False)
CHECKPOINT_FULL = InCheckpoint(optimizer_state=True)
CHECKPOINT_WEIGHTS = InCheckpoint(optimizer_state=False)

CASES = [
    # need, resident engines, store facts (None: not read), where policy k is
    # the resident engines first, the store not read
    (TRAIN, TRAINER, None, IN_TRAINER),
    (SCORE, TRAINER, None, IN_TRAINER),
    (GENERATE, TRAINER, None, IN_TRAINER),  # the hand-off in memory
    (SCORE, SCORER, None, IN_SCORER),
    (GENERATE, SCORER, None, IN_SCORER),
    (GENERATE, GENERATOR, None, IN_GENERATOR),
    (GENERATE, BOTH, None, IN_GENERATOR),
    (GENERATE, STALE_GENERATOR, None, IN_TRAINER),
    (SCORE, BOTH, None, IN_TRAINER),
    # a generator asleep without its weights is given policy k again, as a new one would be
    (GENERATE, ASLEEP, None, IN_TRAINER),
    (GENERATE, ASLEEP_ALONE, None, AskTheStore()),
    (GENERATE, ASLEEP_ALONE, FULL, CHECKPOINT_WEIGHTS),
    (GENERATE, ASLEEP_ALONE, UNCOMMITTED, ByReplay(3)),
    # what they do not serve asks the store
    (TRAIN, SCORER, None, AskTheStore()),  # a scoring engine does not train
    (TRAIN, GENERATOR, None, AskTheStore()),
    (SCORE, GENERATOR, None, AskTheStore()),
    (TRAIN, OLD_TRAINER, None, AskTheStore()),
    (SCORE, OLD_TRAINER, None, AskTheStore()),
    (GENERATE, OLD_TRAINER, None, AskTheStore()),
    (TRAIN, NONE, None, AskTheStore()),
    (SCORE, NONE, None, AskTheStore()),
    (GENERATE, NONE, None, AskTheStore()),
    # the store's facts do not outrank a resident engine
    (TRAIN, TRAINER, LOST, IN_TRAINER),
    (GENERATE, GENERATOR, FULL, IN_GENERATOR),
    # a full checkpoint k: all of it to train, its weights alone otherwise
    (TRAIN, NONE, FULL, CHECKPOINT_FULL),
    (TRAIN, SCORER, FULL, CHECKPOINT_FULL),
    (TRAIN, OLD_TRAINER, FULL, CHECKPOINT_FULL),
    (SCORE, NONE, FULL, CHECKPOINT_WEIGHTS),
    (GENERATE, NONE, FULL, CHECKPOINT_WEIGHTS),
    (GENERATE, OLD_TRAINER, FULL, CHECKPOINT_WEIGHTS),
    # weights alone: enough to score and generate, a replay to train
    (SCORE, NONE, WEIGHTS, CHECKPOINT_WEIGHTS),
    (GENERATE, NONE, WEIGHTS, CHECKPOINT_WEIGHTS),
    (SCORE, NONE, PRUNED, CHECKPOINT_WEIGHTS),
    (GENERATE, NONE, PRUNED, CHECKPOINT_WEIGHTS),
    (TRAIN, NONE, WEIGHTS, ByReplay(3)),
    (TRAIN, SCORER, WEIGHTS, ByReplay(3)),
    # a record-only checkpoint is no source of weights: a replay from c
    (TRAIN, NONE, RECORD, ByReplay(3)),
    (SCORE, NONE, RECORD, ByReplay(3)),
    (GENERATE, NONE, RECORD, ByReplay(3)),
    # nothing committed (between full checkpoints): a replay from c
    (TRAIN, NONE, UNCOMMITTED, ByReplay(3)),
    (SCORE, OLD_TRAINER, UNCOMMITTED, ByReplay(3)),
    (GENERATE, Resident(generator=K - 1), UNCOMMITTED, ByReplay(3)),
    # no full checkpoint left to replay from
    (TRAIN, NONE, PRUNED, Nowhere()),
    (TRAIN, NONE, LOST, Nowhere()),
    (SCORE, NONE, LOST, Nowhere()),
    (GENERATE, NONE, LOST, Nowhere()),
    (SCORE, NONE, Committed("record", None), Nowhere()),
]


@pytest.mark.parametrize(("need", "resident", "committed", "location"), CASES)
def test_locate(need: Need, resident: Resident, committed: Committed | None, location: object) -> None:
    assert locate(K, need, resident, committed) == location


def test_update_zero_is_its_own_full_checkpoint() -> None:
    assert locate(0, TRAIN, NONE, Committed("full", 0)) == CHECKPOINT_FULL
    assert locate(0, TRAIN, Resident(trainer=0, trainer_optimizer_state=True), None) == IN_TRAINER


class NoStore:
    """A store whose every read fails: what the resident engines serve must not read it."""

    url = "memory://no-store"

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the store was read ({name})")


@dataclass
class FakeTrainer:
    weights: dict[str, Any] = field(default_factory=lambda: {"w": torch.zeros(1)})

    @contextmanager
    def live_weights(self) -> Iterator[dict[str, Any]]:
        yield self.weights


@dataclass
class FakeGenerator:
    handoff = "handoff_memory"
    loaded: list[Any] = field(default_factory=list)
    keeps_weights: bool = True
    """What `sleep` says: True as the torch engines, False as vLLM's level 2 on a GPU."""

    def load_weights(self, weights: Any) -> None:
        self.loaded.append(weights)

    def sleep(self) -> bool:
        return self.keeps_weights

    def waking(self) -> AbstractContextManager[None]:
        return nullcontext()


def context(store: Any, tmp_path: Path, run_id: str = "run", update: int = 0) -> StageContext:
    return StageContext(store, run_id, update, RunConfig(), tmp_path)


def test_the_trainer_serves_from_memory_until_optimize_takes_it(tmp_path: Path) -> None:
    engines, trainer = PolicyEngines(), FakeTrainer()
    ctx = context(NoStore(), tmp_path)
    engines.trainer_made(ctx, trainer, 0)  # checkpoint 0
    assert engines.resident == Resident(trainer=0, trainer_optimizer_state=True)
    assert engines.trainer(ctx, optimizer_state=False) is trainer
    assert engines.trainer(ctx, optimizer_state=True) is trainer
    engines.release_trainer(ctx)  # optimize changes it in place
    assert engines.resident == Resident()
    engines.trainer_made(ctx, trainer, 1)
    assert engines.resident == Resident(trainer=1, trainer_optimizer_state=True)
    assert engines.trainer(at_update(ctx, 1), optimizer_state=True) is trainer


def test_the_generator_takes_the_trainers_weights_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[FakeGenerator] = []

    def new_generator(*_: Any) -> FakeGenerator:
        built.append(FakeGenerator())
        return built[-1]

    monkeypatch.setattr(policy, "new_generator", new_generator)
    engines, trainer = PolicyEngines(), FakeTrainer()
    ctx = context(NoStore(), tmp_path)
    engines.trainer_made(ctx, trainer, 0)
    generator = engines.generator(ctx)
    assert built == [generator] and generator.loaded == [trainer.weights]
    assert engines.generator(ctx) is generator  # it holds policy 0 now: nothing handed off again
    assert engines.resident == Resident(trainer=0, trainer_optimizer_state=True, generator=0)
    engines.release_trainer(ctx)
    engines.trainer_made(ctx, trainer, 1)
    assert engines.generator(at_update(ctx, 1)) is generator  # the same engine, given policy 1
    assert len(built) == 1 and len(generator.loaded) == 2
    assert engines.resident == Resident(trainer=1, trainer_optimizer_state=True, generator=1)


def test_another_runs_stages_start_afresh_and_a_failure_releases_all(tmp_path: Path) -> None:
    engines = PolicyEngines()
    engines.trainer_made(context(NoStore(), tmp_path, "one"), FakeTrainer(), 3)
    engines.trainer_made(context(NoStore(), tmp_path, "two"), FakeTrainer(), 0)
    assert engines.resident == Resident(trainer=0, trainer_optimizer_state=True)
    engines.release()
    assert engines.resident == Resident()


def test_a_policy_nothing_rebuilds_is_refused(tmp_path: Path) -> None:
    """No engine holds policy 1 and no full checkpoint is committed: the error says so, and the resident
    trainer on another policy stays."""
    engines = PolicyEngines()
    ctx = context(open_store(tmp_path / "store"), tmp_path, update=2)
    engines.trainer_made(ctx, FakeTrainer(), 2)
    with pytest.raises(
        RuntimeError, match=r"^run run has no committed full checkpoint at or before update 1$"
    ):
        engines.trainer(at_update(ctx, 1), optimizer_state=True)
    assert engines.resident == Resident(trainer=2, trainer_optimizer_state=True)


@pytest.mark.parametrize("keeps_weights", [False, True])
def test_a_generator_asleep_without_its_weights_holds_no_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keeps_weights: bool
) -> None:
    """Asking for the trainer puts the generator to sleep: one that discarded its weights is no resident
    policy (the table's ASLEEP: policy k is handed to it again), one that kept them still holds policy k."""
    generator = FakeGenerator(keeps_weights=keeps_weights)
    monkeypatch.setattr(policy, "new_generator", lambda *_: generator)
    engines, trainer = PolicyEngines(), FakeTrainer()
    ctx = context(NoStore(), tmp_path, update=K)
    engines.trainer_made(ctx, trainer, K)
    engines.generator(ctx)
    engines.trainer(ctx, optimizer_state=False)  # score
    asleep = BOTH if keeps_weights else ASLEEP
    assert engines.resident == asleep
    assert locate(K, GENERATE, asleep, None) == (IN_GENERATOR if keeps_weights else IN_TRAINER)
    assert engines.generator(ctx) is generator  # probe
    assert len(generator.loaded) == (1 if keeps_weights else 2)
    assert engines.resident == BOTH
