"""The policy's journey: which engine holds policy k, where it comes from, and how it reaches the generator.

    policy k  =  a resident engine, when it holds k (the inline and resident runners keep their engines
                 across stages and updates: `PolicyEngines`, reached through `ctx.engines`)
              |  policy k's committed checkpoint (committed.py), unless retention emptied it
              |  a replay from the latest full checkpoint (replay.py), whose trainer then stays resident

Which of these serves a stage is decided in one place, `location.locate`, from the facts `PolicyEngines`
gathers (what its engines hold; the store's facts only where they do not serve); its methods act on the
answer. A generator takes policy k from the trainer in memory (`live_weights`, no host copy; under ZeRO-3
gathered for the hand-off) or from a committed folder (`engines.build.hand_off`). Policy k is committed in
full at update 0, every `checkpoint_every` updates and after the last; between those, optimize commits only
its metrics and the fingerprint of the weights it made.

The two engines take turns on a GPU they share (the phases, `PolicyEngines`): before the trainer is asked
(score, optimize, a replay) the generator sleeps (`GenerationEngine.sleep`: vLLM gives its memory up, the
others keep everything); before it generates again it wakes, its weights' memory first, then policy k's
weights, then its KV cache (`waking`). A generator whose sleep discarded its weights holds no policy: its
`Resident.generator` is None until policy k is handed to it again.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from torch import Tensor

from probepo.engines.base import GenerationEngine, TrainerEngine
from probepo.engines.build import hand_off, load_trainer, new_generator
from probepo.stages.committed import (
    at_update,
    committed_policy,
    fetch_policy,
    latest_full_checkpoint,
    no_full_checkpoint,
)
from probepo.stages.context import StageContext
from probepo.stages.location import (
    AskTheStore,
    ByReplay,
    Engine,
    InCheckpoint,
    InEngine,
    Location,
    Need,
    Nowhere,
    Resident,
    locate,
)
from probepo.stages.replay import restore_trainer

PolicySource = Path | TrainerEngine
"""Where a generator takes policy k from: a committed policy's folder, or a trainer that holds it."""


class PolicyEngines:
    """The engines on the run's policies: the ones a runner keeps alive across the stages and updates of one
    run (`ctx.engines`), or a stage's own (`policy_engines`). Stages get an engine on policy k from it, and
    tell it when the trainer made a policy; nothing else changes what it holds."""

    def __init__(self) -> None:
        self._owner: tuple[str, str] | None = None
        """(store URL, run id) of the run they belong to; another run's stages start afresh."""
        self._trainer: TrainerEngine | None = None
        self._trainer_policy: int | None = None
        self._trainer_optimizer_state = False
        self._generator: GenerationEngine | None = None
        self._generator_policy: int | None = None
        """None also while it sleeps without its weights."""
        self._generator_awake = False

    @property
    def resident(self) -> Resident:
        """Which policy each engine holds: the facts `locate` reads."""
        return Resident(self._trainer_policy, self._trainer_optimizer_state, self._generator_policy)

    def trainer(self, ctx: StageContext, *, optimizer_state: bool) -> TrainerEngine:
        """A trainer engine on policy k, kept resident: with its optimizer state (optimize), or for a forward
        pass (score), where the weights alone will do (the optimizer state, ~6x the weights at 7B, is not
        fetched; such a trainer does not train: asked for one that does, it makes way for it)."""
        location = self._locate(ctx, Need.TRAIN if optimizer_state else Need.SCORE)
        match location:
            case InEngine() if self._trainer is not None:
                self._generator_sleeps()
                return self._trainer
            case _:
                return self._trainer_from_store(ctx, location)

    def generator(self, ctx: StageContext) -> GenerationEngine:
        """A generation engine on policy k, awake and kept resident: the resident one when it holds policy k,
        else one given policy k's weights — the resident trainer's, the committed checkpoint's, or a replay's
        (whose trainer stays resident for the next stages)."""
        location = self._locate(ctx, Need.GENERATE)
        source: PolicySource | None
        match location:
            case InEngine(engine=Engine.GENERATOR) if self._generator is not None:
                source = None
            case InEngine(engine=Engine.TRAINER) if self._trainer is not None:
                source = self._trainer
            case InCheckpoint():
                source = fetch_policy(ctx, optimizer_state=False)
            case _:
                source = self._trainer_from_store(ctx, location)
        self._generator = self._awake_generator(ctx, source)
        self._generator_policy, self._generator_awake = ctx.update, True
        return self._generator

    def trainer_made(self, ctx: StageContext, engine: TrainerEngine, policy: int) -> None:
        """`engine`, its optimizer state included, holds `policy`, which it made (optimize: k + 1;
        checkpoint 0: policy 0): it becomes the resident trainer."""
        self._claim(ctx)
        self._hold_trainer(engine, policy, optimizer_state=True)

    def release_trainer(self, ctx: StageContext) -> None:
        """Forget the trainer (optimize changes it in place: until it has made policy k + 1 it holds
        neither policy); the generator sleeps while it trains."""
        self._claim(ctx)
        self._generator_sleeps()
        self._forget_trainer()

    def release(self) -> None:
        """Forget every engine (after a stage failed: it may have changed one half-way)."""
        self._forget_trainer()
        self._owner, self._generator, self._generator_policy, self._generator_awake = None, None, None, False

    def _claim(self, ctx: StageContext) -> None:
        owner = (ctx.store.url, ctx.run_id)
        if self._owner != owner:
            self.release()
            self._owner = owner

    def _locate(self, ctx: StageContext, need: Need) -> Location:
        """Where policy k is for `need`: the store is read only where the resident engines do not serve."""
        self._claim(ctx)
        location = locate(ctx.update, need, self.resident, None)
        if isinstance(location, AskTheStore):
            location = locate(ctx.update, need, self.resident, committed_policy(ctx))
        return location

    def _trainer_from_store(
        self, ctx: StageContext, location: InCheckpoint | ByReplay | Nowhere
    ) -> TrainerEngine:
        """A trainer on policy k built where `location` says — its checkpoint, or a replay — kept resident."""
        self._generator_sleeps()  # before the trainer's memory comes
        optimizer_state = not isinstance(location, InCheckpoint) or location.optimizer_state
        if optimizer_state and self._trainer is not None and not self._trainer_optimizer_state:
            self._forget_trainer()  # a scoring engine's memory goes before the full trainer's comes
            gc.collect()
        match location:
            case InCheckpoint():
                folder = fetch_policy(ctx, optimizer_state=optimizer_state)
                engine = load_trainer(ctx.config, folder, optimizer_state=optimizer_state)
            case ByReplay(full=full):
                engine = restore_trainer(ctx, full)
            case Nowhere():
                raise no_full_checkpoint(ctx)
        self._hold_trainer(engine, ctx.update, optimizer_state=optimizer_state)
        return engine

    def _generator_sleeps(self) -> None:
        """The trainer works next: the generator gives its memory up (where it shares the GPU), and one whose
        weights went holds no policy."""
        if self._generator is None or not self._generator_awake:
            return
        if not self._generator.sleep():
            self._generator_policy = None
        self._generator_awake = False

    def _awake_generator(self, ctx: StageContext, source: PolicySource | None) -> GenerationEngine:
        """The generator, awake, given policy k's weights from `source` (None: it holds them): a new one,
        or the resident one, whose weights' memory wakes before the hand-off and its KV cache after."""
        if self._generator is None:
            assert source is not None, "locate finds policy k in a generator only where there is one"
            with _weights_of(source) as weights:
                return _new_generator(ctx, weights)
        generator = self._generator
        with nullcontext() if self._generator_awake else generator.waking():
            if source is not None:
                with _weights_of(source) as weights:
                    hand_off(generator, weights)
        return generator

    def _forget_trainer(self) -> None:
        self._trainer, self._trainer_policy, self._trainer_optimizer_state = None, None, False

    def _hold_trainer(self, engine: TrainerEngine, policy: int, *, optimizer_state: bool) -> None:
        self._trainer, self._trainer_policy, self._trainer_optimizer_state = engine, policy, optimizer_state


def policy_engines(ctx: StageContext) -> PolicyEngines:
    """The runner's resident engines, or (a runner that keeps none) engines for this stage alone."""
    return ctx.engines if ctx.engines is not None else PolicyEngines()


def scoring_engine(ctx: StageContext) -> TrainerEngine:
    """A trainer engine on policy k for a forward pass (score)."""
    return policy_engines(ctx).trainer(ctx, optimizer_state=False)


def generation_engine(ctx: StageContext) -> GenerationEngine:
    """A generation engine on policy k (sample, probe, evaluate)."""
    return policy_engines(ctx).generator(ctx)


@contextmanager
def _weights_of(source: PolicySource) -> Iterator[Path | dict[str, Tensor]]:
    """A committed policy's folder, or a trainer's weights as it holds them (no copy: the generator copies
    them into its own memory while they are lent)."""
    if isinstance(source, Path):
        yield source
        return
    with source.live_weights() as weights:
        yield weights


def _new_generator(ctx: StageContext, weights: Path | dict[str, Tensor]) -> GenerationEngine:
    """A generator holding `weights`: a Hugging Face one is built on a full checkpoint's folder (its
    config and tokenizer; the weights' own folder where they are one), then given the weights."""
    if ctx.config.model.kind == "testbed":
        layout = None
    elif isinstance(weights, Path):
        layout = weights
    else:
        full = latest_full_checkpoint(ctx)
        if full is None:
            raise no_full_checkpoint(ctx)
        layout = fetch_policy(at_update(ctx, full), optimizer_state=False)
    generator = new_generator(ctx.config, layout, ctx.scratch)
    if layout is not weights:  # a folder it was built on holds the weights already
        hand_off(generator, weights)
    return generator
