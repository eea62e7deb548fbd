"""Policy k for a stage: the engines on it, taken from the engines a runner keeps resident, from the
committed checkpoint, or rebuilt by replaying optimize.

Policy k is committed in full (weights and optimizer state, as the `checkpoint` of update k) at update 0,
every `checkpoint_every` updates and after the last update; between those, optimize commits only its
metrics and a digest of the weights it made. A runner that keeps its engines alive (`ResidentEngines`:
the inline runner) hands policy k from optimize k - 1 to the next stages in memory. Without them (a fresh
process, a resumed run) policy k is the latest full checkpoint c <= k with the optimize stages of updates
c .. k - 1 replayed from their committed rollouts, old log-probs and advantages: nothing is generated or
graded again, and every replayed update is checked against the digest it committed (a mismatch is recorded
and logged, not fatal: the run goes on, no longer bitwise the uninterrupted one).
"""

from __future__ import annotations

import gc
import hashlib
import logging
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from probepo import distributed, spend
from probepo.config import ModelConfig
from probepo.devices import check_fits_one_gpu, torch_device, weights_bytes
from probepo.engines.base import GenerationEngine, TrainerEngine
from probepo.engines.sampler import TorchGenerationEngine
from probepo.engines.trainer import TorchTrainerEngine
from probepo.models.gpt import GPT, load_model
from probepo.schedule import Stage, is_optimizer_state, optimizer_shard_rank
from probepo.stages.batch import training_batch
from probepo.stages.common import policy_files
from probepo.stages.context import StageContext
from probepo.store.retention import holds

FINGERPRINT = "policy_fingerprint"
"""The key of optimize's summary holding the fingerprint of the weights it made (updates without a full
checkpoint): what a replay must reproduce."""
LEGACY_DIGEST = "policy_sha256"
"""What stores written before the fingerprint committed instead: the sha256 of a host copy of the weights."""
log = logging.getLogger(__name__)


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


def at_update(ctx: StageContext, update: int) -> StageContext:
    """The same stage context, pointed at another update of the run."""
    return replace(ctx, update=update)


def fetch_policy(ctx: StageContext, stage: str = Stage.CHECKPOINT, *, optimizer_state: bool = True) -> Path:
    """Download the policy committed as `stage` of this update (by default checkpoint k, i.e. policy k, in
    full) into scratch; returns its folder. Without `optimizer_state` only what generation reads (weights,
    config, tokenizer): at 7B the optimizer state is most of a checkpoint's bytes. A file already there is
    not fetched again (each appears only once verified). On the ranks of a distributed stage each node's
    leader downloads into its node's scratch what the node's ranks read (of the optimizer shards, only
    theirs), the node's other ranks wait (collective)."""
    update = ctx.update
    folder = ctx.scratch / f"policy-{update:06d}-{stage}"
    ranks_here = distributed.node_ranks()
    if distributed.is_node_leader():
        folder.mkdir(parents=True, exist_ok=True)
        names = ctx.store.read_stage(ctx.run_id, update, stage).marker["files"]
        for name in files_for_node(names, ranks_here, optimizer_state=optimizer_state):
            if not (folder / name).exists():
                landed = ctx.store.download_stage_file(ctx.run_id, update, stage, name, folder / name)
                spend.count("scratch", landed.stat().st_size)
        note_scratch(ctx)
    distributed.barrier()
    return folder


def files_for_node(names: Iterable[str], ranks: Iterable[int], *, optimizer_state: bool) -> list[str]:
    """The files of a checkpoint that a node whose ranks are `ranks` reads: all but the optimizer state,
    and with `optimizer_state` the optimizer files its ranks load (a sharded optimizer's shards of those
    ranks alone, each rank loading only its own)."""
    ranks = set(ranks)

    def wanted(name: str) -> bool:
        if not is_optimizer_state(name):
            return True
        shard = optimizer_shard_rank(name)
        return optimizer_state and (shard is None or shard in ranks)

    return [name for name in names if wanted(name)]


def latest_full_checkpoint(ctx: StageContext) -> int:
    """The latest update c <= k whose policy is committed in full (weights and optimizer state: retention
    may have pruned the optimizer state of older ones)."""
    entries = ctx.store.ledger_entries(ctx.run_id)
    committed = sorted(
        (u for u, stages in entries.items() if u <= ctx.update and Stage.CHECKPOINT in stages), reverse=True
    )
    for update in committed:
        if holds(ctx.store.marker(ctx.run_id, update, Stage.CHECKPOINT) or {}) == "full":
            return update
    pruned = (
        f" (retention pruned the optimizer state of checkpoints {sorted(committed)})" if committed else ""
    )
    raise RuntimeError(
        f"run {ctx.run_id} has no committed full checkpoint at or before update {ctx.update}{pruned}"
    )


def has_weights(ctx: StageContext) -> bool:
    """Whether policy k's weights are committed (a checkpoint that retention has not emptied)."""
    marker = ctx.store.marker(ctx.run_id, ctx.update, Stage.CHECKPOINT)
    return marker is not None and holds(marker) != "record"


def weights_digest(weights: dict[str, Tensor]) -> str:
    """sha256 over the weights' names, dtypes, shapes and bytes (in name order): equal iff bitwise equal.
    The replay check of stores written before `weights_fingerprint` (LEGACY_DIGEST)."""
    digest = hashlib.sha256()
    with spend.timed("digest"):
        for name in sorted(weights):
            tensor = weights[name].detach().cpu().contiguous()
            digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
            digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    spend.count("host_copy", spend.tensor_bytes(weights.values()))  # tobytes copies every weight
    return digest.hexdigest()


def model_dtype(model: ModelConfig) -> torch.dtype:
    """A Hugging Face policy's parameter dtype."""
    return getattr(torch, model.dtype)


def new_trainer(ctx: StageContext, model: Any, tokenizer: Any = None) -> TrainerEngine:
    """A trainer engine on `model` with a fresh optimizer, as the run's config sets it up (for `model.kind:
    hf` the Hugging Face engine, or DeepSpeed's with `model.trainer: deepspeed`, saving `tokenizer` with
    each checkpoint)."""
    cfg = ctx.config
    settings = {"response_budget": cfg.sampling.max_tokens, "temperature": cfg.sampling.temperature}
    if cfg.model.kind == "hf" and cfg.model.trainer == "deepspeed":
        from probepo.engines.deepspeed_engine import DeepSpeedTrainerEngine

        return DeepSpeedTrainerEngine(
            model,
            cfg.optim,
            cfg.algo,
            zero_stage=cfg.model.zero_stage,
            gradient_checkpointing=cfg.model.gradient_checkpointing,
            tokenizer=tokenizer,
            **settings,
        )
    if cfg.model.kind == "hf":
        from probepo.engines.hf import HFTrainerEngine

        return HFTrainerEngine(model, cfg.optim, cfg.algo, tokenizer=tokenizer, **settings)
    return TorchTrainerEngine(model, cfg.optim, cfg.algo, **settings)


def load_trainer(ctx: StageContext, folder: Path, *, optimizer_state: bool = True) -> TrainerEngine:
    """A trainer engine on the policy saved in `folder`, its optimizer state included; without
    `optimizer_state` (scoring) the weights alone under a fresh optimizer, which must not train."""
    model = ctx.config.model
    with spend.timed("load"):
        if model.kind == "hf":
            from probepo.engines.hf import load_policy

            # DeepSpeed places (and under ZeRO-3 partitions) the model on this rank's device itself
            device = "cpu" if model.trainer == "deepspeed" else torch_device()
            engine = new_trainer(ctx, *load_policy(folder, dtype=model_dtype(model), device=device))
        else:
            engine = new_trainer(ctx, GPT(model) if optimizer_state else load_model(folder))
        if optimizer_state:
            engine.load(folder)
    return engine


def replay_optimize(ctx: StageContext, engine: TrainerEngine) -> bool:
    """Redo update k's committed optimize stage on `engine` (policy k): the same batch and seed, so it
    makes policy k + 1 again. Returns whether its weights match the digest optimize committed."""
    marker = ctx.store.marker(ctx.run_id, ctx.update, Stage.OPTIMIZE)
    if marker is None:
        raise RuntimeError(
            f"policy {ctx.update + 1} of run {ctx.run_id} does not exist: the run has not committed update"
            f" {ctx.update}'s optimize stage"
        )
    summary = marker["summary"]
    if FINGERPRINT not in summary and LEGACY_DIGEST not in summary:
        raise RuntimeError(
            f"policy {ctx.update + 1} of run {ctx.run_id} cannot be restored: its checkpoint is missing and"
            f" update {ctx.update}'s optimize stage committed no weight digest to replay it against"
        )
    with spend.timed("optimizer"):
        engine.train_step(training_batch(ctx), seed=ctx.seed(Stage.OPTIMIZE))
    return matches_committed(engine, summary)


def matches_committed(engine: TrainerEngine, summary: Mapping[str, Any]) -> bool:
    """Whether `engine` holds the weights an optimize summary committed: by their fingerprint, or in a store
    written before fingerprints by the sha256 of a host copy (`policy_sha256`)."""
    if FINGERPRINT in summary:
        with spend.timed("digest"):
            return engine.weights_fingerprint() == summary[FINGERPRINT]
    return weights_digest(engine.weights()) == summary[LEGACY_DIGEST]


def restore_trainer(ctx: StageContext) -> TrainerEngine:
    """Policy k with its optimizer state from the store: the latest full checkpoint c <= k, then the
    optimize stages of updates c .. k - 1 replayed. The attempt records `replayed_updates`, `replay_s`
    and, if any, `replay_diverged`: the updates whose replay did not reproduce the committed weights."""
    full = latest_full_checkpoint(ctx)
    engine = load_trainer(ctx, fetch_policy(at_update(ctx, full)))
    if full == ctx.update:
        return engine
    started = time.perf_counter()
    log.info(
        "policy %d: checkpoint %d, then optimize of updates %d-%d replayed",
        ctx.update,
        full,
        full,
        ctx.update - 1,
    )
    diverged = [u for u in range(full, ctx.update) if not replay_optimize(at_update(ctx, u), engine)]
    ctx.attempt_notes.update(
        replayed_updates=ctx.update - full, replay_s=round(time.perf_counter() - started, 3)
    )
    if diverged:
        # Not fatal: the run goes on from a valid policy, but no longer bitwise the uninterrupted one.
        ctx.attempt_notes["replay_diverged"] = diverged
        log.warning(
            "run %s: replaying optimize of updates %s did not reproduce the weights they committed (another"
            " device, dtype or thread count than the run, e.g. OMP_NUM_THREADS); the run goes on, no longer"
            " bitwise equal to an uninterrupted one",
            ctx.run_id,
            diverged,
        )
    return engine


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
    engine = load_trainer(ctx, fetch_policy(ctx, optimizer_state=False), optimizer_state=False)
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
    source: Path | TrainerEngine
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
def _weights_of(source: Path | TrainerEngine) -> Iterator[Path | dict[str, Tensor]]:
    """A committed policy's folder, or a trainer's weights as it holds them (no copy: the generator copies
    them into its own memory while they are lent)."""
    if isinstance(source, Path):
        yield source
        return
    with source.live_weights() as weights:
        yield weights


def _new_generator(ctx: StageContext, weights: Path | dict[str, Tensor]) -> GenerationEngine:
    batching = {"max_batch_rows": ctx.config.sampling.batch_rows, "shards": ctx.config.sampling.shards}
    if ctx.config.model.kind == "testbed":
        generator = TorchGenerationEngine(GPT(ctx.config.model), **batching)
        hand_off(generator, weights)
        return generator
    # The model's layout (config, tokenizer) comes from a full checkpoint, policy k's weights after it.
    layout = weights if isinstance(weights, Path) else None
    folder = layout or fetch_policy(at_update(ctx, latest_full_checkpoint(ctx)), optimizer_state=False)
    model = ctx.config.model
    share, setting = (
        (model.vllm_memory, "model.vllm_memory")
        if model.generator == "vllm"
        else (1.0, "the Hugging Face engine's: the whole GPU")
    )
    check_fits_one_gpu(weights_bytes(folder), share, setting)
    generator: GenerationEngine
    if model.generator == "vllm":
        from probepo.engines.vllm_engine import VLLMGenerationEngine

        generator = VLLMGenerationEngine(
            folder,
            dtype=model.dtype,
            **batching,
            seed=ctx.config.seed,
            scratch=ctx.scratch,
            gpu_memory_utilization=model.vllm_memory,
        )
    else:
        from probepo.engines.hf import HFGenerationEngine

        generator = HFGenerationEngine(folder, dtype=model_dtype(model), device=torch_device(), **batching)
    if layout is None:
        hand_off(generator, weights)
    return generator


def hand_off(generator: GenerationEngine, weights: Path | dict[str, Tensor]) -> None:
    """Policy weights into a generation engine, counted: a state dict as the engine takes it (in memory,
    or through a file: `handoff`), a checkpoint folder as the file it reads."""
    with spend.timed("handoff"):
        generator.load_weights(weights)
    if isinstance(weights, dict):
        spend.count(generator.handoff, spend.tensor_bytes(weights.values()))
    else:
        spend.count(
            "handoff_file", weights_bytes(weights) or sum(f.stat().st_size for f in weights.glob("*"))
        )


@contextmanager
def saved_trainer(ctx: StageContext, engine: TrainerEngine, folder: Path) -> Iterator[dict[str, Path]]:
    """The trainer's state saved into `folder` of the scratch, counted: the files for the block to commit.
    The folder goes after the block (its node's leader removes it): nothing reads a saved state back from
    scratch (a later stage takes it from the resident engine or the store), so a node's scratch holds one
    save at a time, not every part and checkpoint of a job."""
    try:
        with spend.timed("save"):
            engine.save(folder)
        files = policy_files(folder)
        spend.count("scratch", sum(path.stat().st_size for path in files.values()))
        note_scratch(ctx)
        yield files
    finally:
        if distributed.is_node_leader():
            shutil.rmtree(folder, ignore_errors=True)


def note_scratch(ctx: StageContext) -> None:
    """The scratch folder's bytes now, for the attempt's peak (after a save or a download: the moments
    it grows)."""
    spend.note_scratch(sum(path.stat().st_size for path in ctx.scratch.rglob("*") if path.is_file()))
