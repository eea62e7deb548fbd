"""The generating stages' unit of work and safe point: the chunks of an engine call (`engine.chunks`, fixed by
the prefixes and the recipe's batch rows, never by the number of ranks), each decoded by whichever rank
claims it and committed by that rank as a sub-stage `<stage>.shard-CCCC` (its completions, with the rank and
GPU that made them). Ranks claim chunks from a counter their job shares (`distributed.claimed`), so a rank
whose chunks came out shorter takes the next one. A chunk's randomness is its own (`chunk_seed`), so the
stage is the same bits on any number of ranks, whoever made which chunk.

At a preemption signal a rank claims no further chunk; every rank then raises Preempted together (the chunks
already committed stay), and the next attempt, on any number of ranks, makes only the missing chunks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from contextlib import suppress

from probepo import distributed, spend
from probepo.devices import assigned_gpu, gpu_index
from probepo.engines.base import Completion, GenerationEngine, SamplingParams, chunk_seed
from probepo.faults import fault_point
from probepo.preemption import Preempted
from probepo.stages.context import StageContext
from probepo.store import AlreadyCommitted
from probepo.store.formats import table_from_parquet, table_to_parquet

SHARD_TABLE = "shard.parquet"


def shard_name(stage: str, chunk: int) -> str:
    return f"{stage}.shard-{chunk:04d}"


def _committed_chunks(ctx: StageContext, stage: str) -> set[int]:
    prefix = f"{stage}.shard-"
    names = ctx.store.committed_stages(ctx.run_id, ctx.update)
    return {int(name[len(prefix) :]) for name in names if name.startswith(prefix)}


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
) -> list[list[Completion]]:
    """`engine.continue_from` with these arguments, over this job's ranks: every rank calls it alike, makes
    the chunks it claims among those no attempt has committed, and gets every prefix's completions back
    (read from the committed shards). Raises Preempted on every rank when any rank's stop flag is up."""
    plan = engine.chunks(prefixes, n)
    # rank 0's view, before any rank makes a chunk of this call: every rank must claim from the same list
    missing = distributed.broadcast_json(
        sorted(set(range(len(plan))) - _committed_chunks(ctx, stage)) if distributed.rank() == 0 else None
    )
    stop_here = distributed.own_flag(ctx.should_stop)
    made: dict[int, list[list[Completion]]] = {}  # this rank's chunks: not read back from the store
    stopped = False
    for index in distributed.claimed(missing):
        fault_point(ctx.update, shard_name(stage, index), "claimed", stop_here)
        if stop_here():  # a safe point: the chunk just claimed is left to the next attempt
            stopped = True
            break
        chunk = plan[index]
        started = time.perf_counter()
        with spend.timed("generation"):
            completions = engine.decode_chunk(
                [prefixes[i] for i in chunk],
                n,
                params,
                chunk_seed(seed, index),
                [max_new_tokens[i] for i in chunk],
                rescue_ids=rescue_ids,
                rescue_tokens=rescue_tokens,
            )
        decode_s = time.perf_counter() - started
        _commit_shard(ctx, shard_name(stage, index), chunk, completions, decode_s)
        made[index] = completions
    notes = ctx.attempt_notes  # rank 0's, summed over the calls of a stage (a tree grows by several)
    notes["resumed_shards"] = notes.get("resumed_shards", 0) + len(plan) - len(missing)
    notes["shards_run"] = notes.get("shards_run", 0) + len(made)
    if distributed.any_rank(stopped):
        kept = len(_committed_chunks(ctx, stage))
        raise Preempted(
            f"preempted during {stage} of update {ctx.update}: {kept} of {len(plan)} shards committed"
        )
    return _gather_shards(ctx, stage, plan, made)


def _commit_shard(
    ctx: StageContext, name: str, chunk: list[int], completions: list[list[Completion]], decode_s: float
) -> None:
    rows = [(i, c) for i, samples in zip(chunk, completions, strict=True) for c in samples]
    table = {
        "prefix": [i for i, _ in rows],
        "ids": [c.ids for _, c in rows],
        "finish_reason": [c.finish_reason for _, c in rows],
        "rescued": [c.rescued for _, c in rows],
    }
    summary = {
        "prefixes": len(chunk),
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
    # another attempt may have made this chunk meanwhile (a job run twice): the same bits, so it stands
    with suppress(AlreadyCommitted):
        ctx.commit_own(name, {SHARD_TABLE: table_to_parquet(table)}, summary)


def _gather_shards(
    ctx: StageContext, stage: str, plan: list[list[int]], made: dict[int, list[list[Completion]]]
) -> list[list[Completion]]:
    """Every prefix's completions: those of the chunks this rank `made`, the others from their shards of
    `stage`, each checked to hold its chunk's prefixes."""
    results: list[list[Completion]] = [[] for chunk in plan for _ in chunk]
    for index, chunk in enumerate(plan):
        if index in made:
            for i, samples in zip(chunk, made[index], strict=True):
                results[i] = samples
            continue
        name = shard_name(stage, index)
        table = table_from_parquet(ctx.read(name)[SHARD_TABLE])
        if sorted(set(map(int, table["prefix"]))) != sorted(chunk):
            raise RuntimeError(
                f"{name} of update {ctx.update} of run {ctx.run_id} holds other prefixes than chunk {index}"
                " of this call: it was committed with other prefixes or batch rows (sampling.batch_rows);"
                " a stage's recipe must not change once its shards are committed"
            )
        for prefix, ids, reason, rescued in zip(
            table["prefix"], table["ids"], table["finish_reason"], table["rescued"], strict=True
        ):
            results[int(prefix)].append(Completion(list(map(int, ids)), str(reason), bool(rescued)))
    return results
