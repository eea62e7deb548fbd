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
AbandoningStop), and its next run makes that call again, the same bits. An evaluation cuts its calls to a
token budget (`calls_within`, stages/evaluate.py's EVAL_SHARD_TOKENS), so that the call in flight at a stop
ends within its job's grace window and what the stop interrupts is short.

Where the shards are kept is a ShardBook: a stage's go to the run's ledger (LedgerShards); an evaluation
after the fact keeps its own beside the run's evaluations (probepo.run.evaluations), never in the ledger.

A job with more ranks than a step has calls (16 ranks of two 8-GPU nodes, a study recipe's `shards: 8`)
leaves the ranks beyond them idle in that step, and the calls are never split further for them: a chunk is
the unit of randomness (the lockstep engines draw every row of a chunk from one generator, so its rows
cannot be parted), and vLLM rounds each row with its batch-mates unless its batch-invariant mode is on
(off by default: configs/profiles/h200-node.yaml), so a call split over ranks would change the bits with
the world size. A recipe made for more ranks deals its chunks into more calls instead
(`calls_for_every_rank`; configs/deepseekmath-7b-sft-two-nodes.yaml: 16 calls), with other bits than the
recipe it comes from, and `probepo check` warns where a generating job has more ranks than calls.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Protocol

from probepo import spend
from probepo.config import RunConfig
from probepo.data import Problem, Task
from probepo.engines.base import Completion, GenerationEngine, SamplingParams, call_chunks
from probepo.engines.sampler import call_plan, chunk_plan
from probepo.run import distributed
from probepo.run.devices import assigned_gpu, gpu_index
from probepo.run.faults import fault_point
from probepo.run.preemption import Preempted
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
    call_tokens: int | None = None,
) -> list[list[Completion]]:
    """`engine.continue_from` with these arguments, over this job's ranks: every rank calls it alike, makes
    the calls it claims among those no attempt has kept in `book` (default: the run's ledger), and gets
    every prefix's completions back (read from the kept shards). Raises Preempted on every rank when any
    rank's stop flag is up. With `call_tokens`, the engine's calls are cut where their rows could decode
    more tokens than that (`calls_within`): shorter shards, the same samples."""
    book = book or LedgerShards(ctx)
    plan = engine.chunks(prefixes, n)
    calls = engine.calls(len(plan))
    if call_tokens is not None:
        budgets = [n * sum(max_new_tokens[i] for i in chunk) for chunk in plan]
        calls = calls_within(calls, budgets, call_tokens)
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


def calls_within(calls: list[list[int]], chunk_tokens: Sequence[int], budget: int) -> list[list[int]]:
    """`calls` (chunk indices), each cut into runs of its consecutive chunks whose `chunk_tokens` (the most
    a chunk's rows decode) sum to at most `budget`, in order: a call within it stays whole, so a plan that
    fits is the plan as it was. A chunk over it alone is a call of its own: a chunk is one random stream,
    never parted. Every chunk keeps its seed (`chunk_seed` of its index), so the samples are the same
    however the calls are cut: a call is a unit of commit, not of maths (bitwise on CPU; on GPU with
    vLLM's batch-invariant mode)."""
    cut: list[list[int]] = []
    for call in calls:
        run: list[int] = []
        tokens = 0
        for chunk in call:
            if run and tokens + chunk_tokens[chunk] > budget:
                cut.append(run)
                run, tokens = [], 0
            run.append(chunk)
            tokens += chunk_tokens[chunk]
        if run:
            cut.append(run)
    return cut


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


def sample_step_calls(config: RunConfig) -> int:
    """The engine calls of a recipe's sample step (prompts_per_update prompts, group_size samples each): how
    many ranks of a generating job all get a call in every update. (Probe's rows, more in the study recipes,
    vary with the pivots chosen; a tree method samples in levels of its own.) A function of the recipe
    alone, as the calls are: the prompts' lengths order the chunks but do not count them."""
    return len(call_plan(_sample_chunks(config), config.sampling.shards))


def calls_for_every_rank(config: RunConfig, ranks: int) -> dict[str, int] | None:
    """`sampling.shards` and `sampling.batch_rows` of a variant of `config` whose sample step has a call for
    each of `ranks` ranks: at least `ranks` calls, of the recipe's own chunks where they number `ranks`,
    else of chunks as large as leave `ranks` of them. Other bits than the recipe's (a chunk is the unit of
    randomness, and vLLM rounds a row with its call's other rows). None where the recipe samples fewer
    prompts per update than `ranks`: a chunk holds one prompt at least."""
    prompts_per_chunk = config.prompts_per_update // ranks
    if prompts_per_chunk == 0:
        return None
    sampling = config.sampling
    fitting = _sample_chunks(config) >= ranks
    batch_rows = sampling.batch_rows if fitting else prompts_per_chunk * config.group_size
    return {"shards": max(ranks, sampling.shards or ranks), "batch_rows": batch_rows}


def _sample_chunks(config: RunConfig) -> int:
    """The chunks of a recipe's sample step."""
    return len(chunk_plan([0] * config.prompts_per_update, config.group_size, config.sampling.batch_rows))


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
