"""Safe points inside the generating stages: each chunk of prefixes the engine decodes is committed as a
sub-stage `<stage>.shard-NNNN` (its completions and the engine's state after it). A stage stopped by a
preemption signal commits the chunk in hand and raises Preempted; its next attempt passes the committed
shards back to the engine, which continues after them bitwise as if it had never stopped.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from probepo.engines.base import Completion, GenerationEngine, SamplingParams
from probepo.preemption import Preempted
from probepo.stages.context import StageContext
from probepo.store.formats import table_from_parquet, table_to_parquet, tensors_from_bytes, tensors_to_bytes

SHARD_TABLE = "shard.parquet"
SHARD_STATE = "state.safetensors"


def shard_name(stage: str, index: int) -> str:
    return f"{stage}.shard-{index:04d}"


def _committed_shards(ctx: StageContext, stage: str) -> list[str]:
    prefix = f"{stage}.shard-"
    return sorted(s for s in ctx.store.committed_stages(ctx.run_id, ctx.update) if s.startswith(prefix))


def continue_in_shards(
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
    """`engine.continue_from` with these arguments, committing every decoded chunk as a shard of `stage` and
    stopping (Preempted) after a shard when the stop flag is up; resumes from the shards committed by
    earlier attempts."""
    done: dict[int, list[Completion]] = {}
    state: bytes | None = None
    names = _committed_shards(ctx, stage)
    for name in names:
        files = ctx.read(name)
        table = table_from_parquet(files[SHARD_TABLE])
        for prefix, ids, reason, rescued in zip(
            table["prefix"], table["ids"], table["finish_reason"], table["rescued"], strict=True
        ):
            done.setdefault(int(prefix), []).append(
                Completion(list(map(int, ids)), str(reason), bool(rescued))
            )
        state = tensors_from_bytes(files[SHARD_STATE])["state"].numpy().tobytes()
    notes = ctx.attempt_notes  # summed over the calls of a stage (a tree grows by several)
    notes["resumed_at_shard"] = notes.get("resumed_at_shard", 0) + len(names)
    written = [len(names)]

    def commit(chunk: list[int], completions: list[list[Completion]], after: bytes) -> None:
        rows = [(i, c) for i, samples in zip(chunk, completions, strict=True) for c in samples]
        table = {
            "prefix": [i for i, _ in rows],
            "ids": [c.ids for _, c in rows],
            "finish_reason": [c.finish_reason for _, c in rows],
            "rescued": [c.rescued for _, c in rows],
        }
        blob = torch.from_numpy(np.frombuffer(after, dtype=np.uint8).copy())
        name = shard_name(stage, written[0])
        files = {SHARD_TABLE: table_to_parquet(table), SHARD_STATE: tensors_to_bytes({"state": blob})}
        ctx.commit(name, files, {"prefixes": len(chunk)})
        written[0] += 1
        if ctx.should_stop():
            raise Preempted(f"preempted after {name} of update {ctx.update}; progress committed")

    results = engine.continue_from(
        prefixes,
        n,
        params,
        seed,
        max_new_tokens,
        rescue_ids=rescue_ids,
        rescue_tokens=rescue_tokens,
        done=done,
        state=state,
        on_chunk=commit,
    )
    notes["shards_run"] = notes.get("shards_run", 0) + written[0] - len(names)
    return results
