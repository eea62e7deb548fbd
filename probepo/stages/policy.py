"""The policy's journey: which engine holds policy k, where it comes from, and how it reaches the generator.

    policy k  =  the resident trainer, when it holds k (the inline and resident runners keep their
                 engines across stages and updates: `ResidentEngines`, reached through `ctx.engines`)
              |  policy k's committed weights (committed.py: a checkpoint retention has not emptied)
              |  a replay from the latest full checkpoint (replay.py), whose trainer then stays resident

A generator takes it from the trainer in memory (`live_weights`, no host copy; under ZeRO-3 gathered for
the hand-off) or from a committed folder (`engines.build.hand_off`). Policy k is committed in full at
update 0, every `checkpoint_every` updates and after the last; between those, optimize commits only its
metrics and the fingerprint of the weights it made.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from probepo.engines.base import GenerationEngine, TrainerEngine
from probepo.engines.build import hand_off, load_trainer, new_generator
from probepo.stages.committed import at_update, fetch_policy, has_weights, latest_full_checkpoint
from probepo.stages.context import StageContext
from probepo.stages.replay import restore_trainer

PolicySource = Path | TrainerEngine
"""Where a generator takes policy k from: a committed policy's folder, or a trainer that holds it."""


@dataclass
class ResidentEngines:
    """The engines a runner keeps alive across the stages and updates of one run, each with the update of
    the policy it holds (-1: none). Stages reach them through `ctx.engines`."""

    owner: tuple[str, str] | None = None
    """(store URL, run id) of the run they belong to; another run's stages start afresh."""
    trainer: TrainerEngine | None = None
    trainer_policy: int = -1
    trainer_trains: bool = True
    """The resident trainer holds its optimizer state (False: loaded with the weights alone, for scoring)."""
    generator: GenerationEngine | None = None
    generator_policy: int = -1

    def claim(self, ctx: StageContext) -> None:
        owner = (ctx.store.url, ctx.run_id)
        if self.owner != owner:
            self.clear()
            self.owner = owner

    def clear(self) -> None:
        """Forget every engine (after a stage failed: it may have changed one half-way)."""
        self.owner, self.trainer, self.generator = None, None, None
        self.trainer_policy = self.generator_policy = -1
        self.trainer_trains = True


def trainer_engine(ctx: StageContext) -> TrainerEngine:
    """A trainer engine on policy k, optimizer state included: the resident one when it holds policy k,
    else restored from the store (and kept resident)."""
    engines = ctx.engines
    if engines is not None:
        engines.claim(ctx)
        if engines.trainer is not None and engines.trainer_policy == ctx.update and engines.trainer_trains:
            return engines.trainer
        if not engines.trainer_trains:  # a scoring engine's memory goes before the full trainer's comes
            keep_trainer(ctx, None, -1)
            gc.collect()
    engine = restore_trainer(ctx)
    keep_trainer(ctx, engine, ctx.update)
    return engine


def scoring_engine(ctx: StageContext) -> TrainerEngine:
    """A trainer engine on policy k for a forward pass: the resident one when it holds policy k; else,
    where policy k's weights are committed, one on those weights alone (the optimizer state, ~6x the
    weights at 7B, is not fetched; kept resident as one that does not train: optimize replaces it); else
    the full trainer by replay (`trainer_engine`)."""
    engines = ctx.engines
    if engines is not None:
        engines.claim(ctx)
        if engines.trainer is not None and engines.trainer_policy == ctx.update:
            return engines.trainer
    if not has_weights(ctx):
        return trainer_engine(ctx)
    engine = load_trainer(ctx.config, fetch_policy(ctx, optimizer_state=False), optimizer_state=False)
    keep_trainer(ctx, engine, ctx.update, trains=False)
    return engine


def keep_trainer(
    ctx: StageContext, engine: TrainerEngine | None, policy: int, *, trains: bool = True
) -> None:
    """Make `engine` (on policy `policy`; `trains`: with its optimizer state) the resident trainer, if the
    runner keeps engines; None drops it (optimize changes the trainer in place: until it has made policy
    k + 1 the engine holds neither)."""
    engines = ctx.engines
    if engines is not None:
        engines.claim(ctx)
        engines.trainer, engines.trainer_policy = engine, policy if engine is not None else -1
        engines.trainer_trains = trains


def generation_engine(ctx: StageContext) -> GenerationEngine:
    """A generation engine on policy k: the resident one when it holds policy k, else one loaded with
    policy k's weights — the resident trainer's, the committed checkpoint's, or a replay's."""
    engines = ctx.engines
    if engines is not None:
        engines.claim(ctx)
        if engines.generator is not None and engines.generator_policy == ctx.update:
            return engines.generator
    source: PolicySource
    if engines is not None and engines.trainer is not None and engines.trainer_policy == ctx.update:
        source = engines.trainer
    elif has_weights(ctx):
        source = fetch_policy(ctx, optimizer_state=False)
    else:
        source = trainer_engine(ctx)  # a replay, whose trainer stays resident for the next stages
    with _weights_of(source) as weights:
        if engines is not None and engines.generator is not None:
            generator = engines.generator
            hand_off(generator, weights)
        else:
            generator = _new_generator(ctx, weights)
    if engines is not None:
        engines.generator, engines.generator_policy = generator, ctx.update
    return generator


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
        layout = fetch_policy(at_update(ctx, latest_full_checkpoint(ctx)), optimizer_state=False)
    generator = new_generator(ctx.config, layout, ctx.scratch)
    if layout is not weights:  # a folder it was built on holds the weights already
        hand_off(generator, weights)
    return generator
