"""Which stages there are and what each is to the rest of the code: the stage table (`STAGES`), and from it
the order of a run, shared by the driver, resume points and `store ls`.

Plain integers in, stage names out, and no heavy imports: reading where a run stands needs no torch. The
table lives here, below the stages, because the configuration reads it too (EVERY_RANK) and may import
nothing above this module.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar


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


POLICY = "<policy>"
"""Not a file's name: a policy's files as its trainer saves them (a testbed's weights, config, optimizer state
and step counts; a Hugging Face model adds its tokenizer's, DeepSpeed its optimizer shards), committed and
read whole (stages/committed.py). Where policy k is not committed in full (`checkpoint_every` > 1) a stage
takes it from the resident trainer or rebuilds it by replay (stages/policy.py, replay.py)."""
WARMUP_MODEL = ("model.safetensors", "config.json")
"""The warm-up's files: the testbed model's weights and configuration (checkpoint 0 adds an optimizer)."""
EVAL_RESULTS = "eval.parquet"
"""The evaluate stage's per-problem table (what reports read back)."""
BENCHMARK_RESULTS = "eval-*.parquet"
"""The evaluate stage's per-problem tables of a maths run with `eval.benchmarks`, one per benchmark."""
ROLLOUTS = "rollouts.parquet"
TREE = "tree.parquet"
"""The tree baselines' trees, one row per node (trees.py), committed by sample beside the rollouts."""
SCORES = "scores.safetensors"
PIVOTS = "pivots.safetensors"
"""The select stage's [N, M] `pivot_pos` (-1 = none)."""
VALUES = "values.safetensors"
"""The probe stage's [N, M] prefix `values` and their counts (successes, trials, rescued)."""
ADVANTAGES = "advantages.safetensors"
"""The advantage stage's `advantages` [R, T] and, for spo_tree, its loss mask (methods.advantages)."""


class When(StrEnum):
    """Which updates of a run a stage runs at (stages_for_update)."""

    WARMUP = "warm-up"
    """None: it is the single stage of a warm-up run, made before the runs that start from it."""
    FIRST = "first"
    """Update 0 alone (later policies come from optimize)."""
    EVALUATION = "evaluation"
    """Every `eval.every` updates and after the last."""
    TRAINING = "training"
    """Every update but the one after the last (where only the final evaluation runs)."""


@dataclass(frozen=True)
class StageSpec:
    """What one stage is to the driver, the runners, the executors and the inputs the method table reads.
    Its own progress (shards of its engine calls, optimize's parts: sub-stages `<stage>.<name>`) is not
    listed: only the stage itself reads it."""

    module: str
    """The module whose `run(ctx)` runs it (what stages/runners.py resolves)."""
    when: When
    reads: tuple[tuple[Stage, str], ...] = ()
    """The committed files it may read: (the stage whose folder holds it, its name) of the same update, or
    of the warm-up run for the warm-up's files. A method reads only those its rules ask for."""
    writes: tuple[str, ...] = ()
    """The files it may commit in its own folder: names, a glob of names, or POLICY."""
    every_rank: bool = False
    """Every rank of a multi-task job runs it: generation split in chunks over the ranks (one engine per GPU:
    stages/shards.py) or the trainer's (DeepSpeed over the ranks). Else rank 0 alone: short CPU work."""
    commits_next_checkpoint: bool = False
    """It makes policy k + 1 and commits it as the checkpoint of update k + 1 when that is due in full
    (`full_checkpoint`), resuming from parts `<stage>.part-NNNN` that a stop committed: once it is
    committed, the driver prunes those parts and applies checkpoint retention."""


Entry = TypeVar("Entry")


class UnknownStage(KeyError):
    """A stage name that a stage table does not hold."""

    def __str__(self) -> str:
        return str(self.args[0])


class StageTable(Mapping[Stage, Entry]):
    """A read-only table keyed by stage, in the order given; a lookup of a stage it lacks raises UnknownStage
    naming it and the stages it holds."""

    def __init__(self, entries: Mapping[Stage, Entry]) -> None:
        self._entries = dict(entries)

    def __getitem__(self, stage: str) -> Entry:
        try:
            return self._entries[stage]  # type: ignore[index]
        except KeyError:
            known = ", ".join(self._entries)
            raise UnknownStage(f"unknown stage '{stage}': the stages are {known}") from None

    def __iter__(self) -> Iterator[Stage]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


_POLICY_K = ((Stage.CHECKPOINT, POLICY),)
"""Policy k: checkpoint k, made by the checkpoint stage at update 0, later by optimize of update k - 1."""

STAGES: StageTable[StageSpec] = StageTable(
    {
        Stage.WARMUP: StageSpec("probepo.stages.warmup", When.WARMUP, writes=WARMUP_MODEL),
        # a Hugging Face model's checkpoint 0 reads its pretrained weights instead (outside the store)
        Stage.CHECKPOINT: StageSpec(
            "probepo.stages.checkpoint",
            When.FIRST,
            reads=tuple((Stage.WARMUP, name) for name in WARMUP_MODEL),
            writes=(POLICY,),
        ),
        Stage.EVALUATE: StageSpec(
            "probepo.stages.evaluate",
            When.EVALUATION,
            reads=_POLICY_K,
            writes=(EVAL_RESULTS, BENCHMARK_RESULTS),
            every_rank=True,
        ),
        Stage.SAMPLE: StageSpec(
            "probepo.stages.sample", When.TRAINING, reads=_POLICY_K, writes=(ROLLOUTS, TREE), every_rank=True
        ),
        Stage.SCORE: StageSpec(
            "probepo.stages.score",
            When.TRAINING,
            reads=((Stage.SAMPLE, ROLLOUTS), (Stage.SAMPLE, TREE), *_POLICY_K),
            writes=(SCORES,),
            every_rank=True,
        ),
        Stage.SELECT: StageSpec(
            "probepo.stages.select",
            When.TRAINING,
            reads=((Stage.SAMPLE, ROLLOUTS), (Stage.SCORE, SCORES)),
            writes=(PIVOTS,),
        ),
        Stage.PROBE: StageSpec(
            "probepo.stages.probe",
            When.TRAINING,
            reads=((Stage.SAMPLE, ROLLOUTS), (Stage.SELECT, PIVOTS), *_POLICY_K),
            writes=(VALUES,),
            every_rank=True,
        ),
        Stage.ADVANTAGE: StageSpec(
            "probepo.stages.advantage",
            When.TRAINING,
            reads=(
                (Stage.SAMPLE, ROLLOUTS),
                (Stage.SAMPLE, TREE),
                (Stage.SCORE, SCORES),
                (Stage.SELECT, PIVOTS),
                (Stage.PROBE, VALUES),
            ),
            writes=(ADVANTAGES,),
        ),
        # its own folder holds its summary alone; policy k + 1 goes to the checkpoint of update k + 1
        Stage.OPTIMIZE: StageSpec(
            "probepo.stages.optimize",
            When.TRAINING,
            reads=(
                (Stage.SAMPLE, ROLLOUTS),
                (Stage.SAMPLE, TREE),
                (Stage.SCORE, SCORES),
                (Stage.ADVANTAGE, ADVANTAGES),
                *_POLICY_K,
            ),
            every_rank=True,
            commits_next_checkpoint=True,
        ),
    }
)
"""Every stage, in the order an update runs them (the warm-up first: it comes before the run)."""

TRAINING_STAGES = tuple(stage for stage, spec in STAGES.items() if spec.when == When.TRAINING)
"""The stages of one update, in order."""
EVERY_RANK = tuple(stage for stage, spec in STAGES.items() if spec.every_rank)
"""The stages that run on every rank of a multi-task job (StageSpec.every_rank)."""
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
    """The stages the driver runs for update k, in the table's order: checkpoint 0 first (k = 0; later
    checkpoints come from optimize), an evaluation of policy k when due (every `eval_every` updates and
    after the last), then training (not after the last update, where only the final evaluation runs)."""
    due = {
        When.WARMUP: False,
        When.FIRST: update == 0,
        When.EVALUATION: update % eval_every == 0 or update == num_updates,
        When.TRAINING: update < num_updates,
    }
    return [stage for stage, spec in STAGES.items() if due[spec.when]]


def written_by(name: str) -> Stage:
    """The stage whose folder holds the file `name` of an update: the one stage of STAGES that writes it."""
    for stage, spec in STAGES.items():
        if name in spec.writes:
            return stage
    raise ValueError(
        f"no stage writes a file {name!r}: the stage table (probepo.run.schedule.STAGES) lists none"
    )


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
