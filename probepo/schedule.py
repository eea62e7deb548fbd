"""Which stages run at each update: the order of a run, shared by the driver, resume points and `store ls`.

Plain integers in, stage names out, and no heavy imports: reading where a run stands needs no torch.
"""

from __future__ import annotations

import re
from enum import StrEnum


class Stage(StrEnum):
    """Every stage's name, as the store's keys, the ledger, job records and execution profiles spell it."""

    WARMUP = "warmup"
    """The single stage of a warm-up run (its own run in the store, shared by the runs that start from it)."""
    CHECKPOINT = "checkpoint"
    """Policy k in full at update k (the store lays it out under checkpoints/<k>/)."""
    EVALUATE = "evaluate"
    SAMPLE = "sample"
    SCORE = "score"
    SELECT = "select"
    PROBE = "probe"
    ADVANTAGE = "advantage"
    OPTIMIZE = "optimize"
    DRIVER = "driver"
    """Not a stage: the one job of the resident executor, which runs the driver itself (every stage left,
    the engines resident) inside one allocation. Its job records sit with update 0's."""
    EVAL_TASK = "eval_task"
    """Not a stage: one task of an evaluation job array (the nightly evaluation, the evaluate flow), one
    checkpoint on one suite in one process, its profile entry one GPU by default
    (`ExecutionProfile.resources`)."""


TRAINING_STAGES = (Stage.SAMPLE, Stage.SCORE, Stage.SELECT, Stage.PROBE, Stage.ADVANTAGE, Stage.OPTIMIZE)
"""The stages of one update, in order."""
EVERY_RANK = (Stage.SAMPLE, Stage.PROBE, Stage.EVALUATE, Stage.SCORE, Stage.OPTIMIZE)
"""The stages that run on every rank of a multi-task job: generation split in chunks over the ranks (one
engine per GPU: stages/shards.py) and the trainer's (DeepSpeed over the ranks). The others (select,
advantage, checkpoint 0, warm-up) are short CPU work, run by rank 0 alone."""
EVAL_RESULTS = "eval.parquet"
"""The evaluate stage's per-problem table (what reports read back)."""
OPTIMIZER_STATE_PREFIX = "optimizer"
"""The files of a checkpoint that hold the trainer's optimizer state (optimizer.safetensors, DeepSpeed's
optimizer-rank-*): only resuming the trainer reads them; generation and evaluation need the rest."""


def is_optimizer_state(name: str) -> bool:
    """Whether a checkpoint's file `name` is optimizer state (see OPTIMIZER_STATE_PREFIX)."""
    return name.startswith(OPTIMIZER_STATE_PREFIX)


def optimizer_shard_name(rank: int, world: int) -> str:
    """The stem of the files (.safetensors and .json) of rank `rank`'s optimizer shard among `world` ranks
    (DeepSpeed ZeRO's): only that rank reads them."""
    return f"{OPTIMIZER_STATE_PREFIX}-rank-{rank:05d}-of-{world:05d}"


_SHARD = re.compile(rf"{OPTIMIZER_STATE_PREFIX}-rank-(\d+)-of-\d+\.")


def optimizer_shard_rank(name: str) -> int | None:
    """The rank whose optimizer shard the file `name` holds (optimizer_shard_name); None: not a shard."""
    found = _SHARD.match(name)
    return int(found.group(1)) if found else None


def stages_for_update(update: int, *, num_updates: int, eval_every: int) -> list[Stage]:
    """The stages the driver runs for update k: checkpoint 0 first (k = 0; later checkpoints come from
    optimize), an evaluation of policy k when due (every `eval_every` updates and after the last), then
    training (not after the last update, where only the final evaluation runs)."""
    stages = [Stage.CHECKPOINT] if update == 0 else []
    if update % eval_every == 0 or update == num_updates:
        stages.append(Stage.EVALUATE)
    if update < num_updates:
        stages.extend(TRAINING_STAGES)
    return stages


def full_checkpoint(update: int, *, num_updates: int, every: int) -> bool:
    """Whether policy k is committed in full (weights and optimizer state): at update 0, every `every`
    updates (the run's `checkpoint_every`) and after the last update."""
    return update % every == 0 or update == num_updates


def resident_refusal(checkpoint_every: int) -> str | None:
    """Why a run with `checkpoint_every` cannot run where each stage is a job of its own (None: it can)."""
    if checkpoint_every <= 1:
        return None
    return (
        f"checkpoint_every = {checkpoint_every} needs engines that stay resident from update to update, and"
        " this executor starts a job per stage (each would replay every update since the last full"
        " checkpoint): use `--executor resident` (the driver as one SLURM job) or `inline`, or set"
        " checkpoint_every = 1"
    )
