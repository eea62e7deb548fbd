"""The generating stages' unit of work and safe point: the engine calls of a step (`engine.calls` of its
`engine.chunks`, fixed by the prefixes and the recipe's batch rows and shards, never by the number of ranks),
each decoded by whichever rank claims it and committed by that rank as a sub-stage `<stage>.shard-CCCC` (its
completions, with the rank and GPU that made them). Ranks claim calls from a counter their job shares
(`distributed.claimed`), so a rank whose calls came out shorter takes the next one. A chunk's randomness is
its own (`chunk_seed`), and a call's chunks are the recipe's, so the stage is the same bits on any number of
ranks, whoever made which call.

At a preemption signal a rank claims no further call; every rank then raises Preempted together (the shards
already committed stay), and the next attempt, on any number of ranks, makes only the missing ones. An
evaluation's array task does not wait for the call in flight: its stop abandons it at once (slurm/job.py:
AbandoningStop), and its next run makes that call again, the same bits.

Where the shards are kept is a ShardBook: a stage's go to the run's ledger (LedgerShards); an evaluation
after the fact keeps its own beside the run's evaluations (probepo.evaluations), never in the ledger.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Protocol

from probepo import distributed, spend
from probepo.data import Problem, Task
from probepo.devices import assigned_gpu, gpu_index
from probepo.engines.base import Completion, GenerationEngine, SamplingParams, call_chunks
from probepo.faults import fault_point
from probepo.preemption import Preempted
from probepo.stages.context import StageContext
from probepo.store import AlreadyCommitted
from probepo.store.errors import FormatError
from probepo.store.formats import table_from_parquet, table_to_parquet

SHARD_TABLE = "shard.parquet"


def shard_name(stage: str, chunk: int) -> str:
    return f"{stage}.shard-{chunk:04d}"


def shard_indices(names: Sequence[str], stage: str) -> set[int]:
    """The call indices of the shards of `stage` among sub-stage names."""
    prefix = f"{stage}.shard-"
    return {int(name[len(prefix) :]) for name in names if name.startswith(prefix)}


class ShardBook(Protocol):
    """Where a generating step keeps its shards (each the parquet table of one engine call's completions)."""

    def committed(self, stage: str) -> set[int]:
        """The calls of `stage` whose shards are kept."""
        ...

    def commit(self, name: str, table: bytes, summary: Mapping[str, Any]) -> None:
        """Keep one shard, made by this rank alone; a shard kept already (the same bits) stands."""
        ...

    def read(self, name: str) -> bytes:
        """A kept shard's table."""
        ...


@dataclass(frozen=True)
class LedgerShards:
    """A stage's shards: sub-stages `<stage>.shard-CCCC` of its update in the run's ledger."""

    ctx: StageContext

    def committed(self, stage: str) -> set[int]:
        return shard_indices(self.ctx.store.committed_stages(self.ctx.run_id, self.ctx.update), stage)

    def commit(self, name: str, table: bytes, summary: Mapping[str, Any]) -> None:
        # another attempt may have made this chunk meanwhile (a job run twice): the same bits, so it stands
        with suppress(AlreadyCommitted):
            self.ctx.commit_own(name, {SHARD_TABLE: table}, summary)

    def read(self, name: str) -> bytes:
        return self.ctx.read(name)[SHARD_TABLE]


def generate_in_shards(
    ctx: StageContext,
    stage: str,
    engine: GenerationEngine,
    prefixes: list[list[int]],
    n: int,
    params: SamplingParams,
    seed: int,
    max_new_tokens: list[int],
    *,
    rescue_ids: Sequence[int] = (),
    rescue_tokens: int = 0,
    book: ShardBook | None = None,
) -> list[list[Completion]]:
    """`engine.continue_from` with these arguments, over this job's ranks: every rank calls it alike, makes
    the calls it claims among those no attempt has kept in `book` (default: the run's ledger), and gets
    every prefix's completions back (read from the kept shards). Raises Preempted on every rank when any
    rank's stop flag is up."""
    book = book or LedgerShards(ctx)
    plan = engine.chunks(prefixes, n)
    calls = engine.calls(len(plan))
    # rank 0's view, before any rank makes a call of this step: every rank must claim from the same list
    missing = distributed.broadcast_json(
        sorted(set(range(len(calls))) - book.committed(stage)) if distributed.rank() == 0 else None
    )
    stop_here = distributed.own_flag(ctx.should_stop)
    made: dict[int, list[list[Completion]]] = {}  # this rank's calls: not read back from the store
    stopped = False
    for index in distributed.claimed(missing):
        fault_point(ctx.update, shard_name(stage, index), "claimed", stop_here)
        if stop_here():  # a safe point: the call just claimed is left to the next attempt
            stopped = True
            break
        chunks = call_chunks(prefixes, max_new_tokens, plan, calls[index], seed)
        started = time.perf_counter()
        with spend.timed("generation"):
            decoded = engine.decode_chunks(
                chunks, n, params, rescue_ids=rescue_ids, rescue_tokens=rescue_tokens
            )
        decode_s = time.perf_counter() - started
        completions = [row for rows in decoded for row in rows]
        book.commit(
            shard_name(stage, index), *_shard(_prefixes_of(plan, calls[index]), completions, decode_s)
        )
        made[index] = completions
    notes = ctx.attempt_notes  # rank 0's, summed over the calls of a stage (a tree grows by several)
    notes["resumed_shards"] = notes.get("resumed_shards", 0) + len(calls) - len(missing)
    notes["shards_run"] = notes.get("shards_run", 0) + len(made)
    if distributed.any_rank(stopped):
        kept = len(book.committed(stage))
        raise Preempted(
            f"preempted during {stage} of update {ctx.update}: {kept} of {len(calls)} shards committed",
            progressed=bool(made),
        )
    return _gather_shards(ctx, book, stage, [_prefixes_of(plan, call) for call in calls], made)


def graded_over_ranks(ctx: StageContext, task: Task, texts: list[str], problems: list[Problem]) -> list[str]:
    """`task.grade_many(texts, problems)` on every rank, each answer graded by one rank only: rank r grades
    answers r, r + world, … (a spread, as grading time varies with the answer), and the outcomes are
    gathered. Rank 0's attempt notes `graded`: the answers each rank graded."""
    world, rank = distributed.world_size(), distributed.rank()
    with spend.timed("grading"):
        mine = task.grade_many(texts[rank::world], problems[rank::world])
    parts = distributed.all_gather_json(mine)
    outcomes: list[str] = [""] * len(texts)
    for part_rank, part in enumerate(parts):
        outcomes[part_rank::world] = part
    earlier = ctx.attempt_notes.get("graded", [0] * world)  # a stage may grade several times (suites)
    ctx.attempt_notes["graded"] = [count + len(part) for count, part in zip(earlier, parts, strict=True)]
    return outcomes


def _prefixes_of(plan: list[list[int]], call: list[int]) -> list[int]:
    """The prefix indices an engine call decodes, chunk after chunk."""
    return [i for c in call for i in plan[c]]


def _shard(
    prefixes: list[int], completions: list[list[Completion]], decode_s: float
) -> tuple[bytes, dict[str, Any]]:
    """One engine call's shard: the table of its completions and a summary of who made it."""
    rows = [(i, c) for i, samples in zip(prefixes, completions, strict=True) for c in samples]
    table = {
        "prefix": [i for i, _ in rows],
        "ids": [c.ids for _, c in rows],
        "finish_reason": [c.finish_reason for _, c in rows],
        "rescued": [c.rescued for _, c in rows],
    }
    summary = {
        "prefixes": len(prefixes),
        # who made it: the rank, its node and process, and the GPU it was given (as the scheduler names it,
        # and its index among the GPUs the rank sees, which its engines were built on)
        "rank": distributed.rank(),
        "node": distributed.node_name(),
        "pid": os.getpid(),
        "gpu": assigned_gpu(),
        "gpu_index": gpu_index(),
        "tokens": sum(len(sample.ids) for samples in completions for sample in samples),
        "decode_s": round(decode_s, 4),
    }
    return table_to_parquet(table), summary


def _gather_shards(
    ctx: StageContext,
    book: ShardBook,
    stage: str,
    shards: list[list[int]],
    made: dict[int, list[list[Completion]]],
) -> list[list[Completion]]:
    """Every prefix's completions: those of the calls this rank `made`, the others from their shards of
    `stage` in `book`, each checked to hold its call's prefixes (`shards`: each call's prefix indices)."""
    results: list[list[Completion]] = [[] for shard in shards for _ in shard]
    for index, shard in enumerate(shards):
        if index in made:
            for i, samples in zip(shard, made[index], strict=True):
                results[i] = samples
            continue
        name = shard_name(stage, index)
        try:
            table = table_from_parquet(book.read(name))
        except FormatError as exc:  # a torn or foreign object under the shard's key
            raise RuntimeError(
                f"{name} of update {ctx.update} of run {ctx.run_id} is unreadable ({exc}): delete it and the"
                " next attempt makes that call again"
            ) from exc
        if sorted(set(map(int, table["prefix"]))) != sorted(shard):
            raise RuntimeError(
                f"{name} of update {ctx.update} of run {ctx.run_id} holds other prefixes than call {index}"
                " of this step: it was committed with other prefixes, batch rows or shards"
                " (sampling.batch_rows, sampling.shards); a stage's recipe must not change once its shards"
                " are committed"
            )
        for prefix, ids, reason, rescued in zip(
            table["prefix"], table["ids"], table["finish_reason"], table["rescued"], strict=True
        ):
            results[int(prefix)].append(Completion(list(map(int, ids)), str(reason), bool(rescued)))
    return results
