"""What each rank of the vLLM tier's two-rank job does (a submitit local job of two tasks, as a stage job's
ranks run): join the group, build its own engine (external_launcher), make the chunks it claims, then stop
its engine and check that the job's group survived."""

from __future__ import annotations

from pathlib import Path

from probepo.engines.base import call_chunks
from probepo.run import distributed
from probepo.run.devices import gpu_index
from slurm.ranks import job_ranks
from tests.hf.test_generation import PROMPTS, SAMPLE

SEED = 11


def generate_on_ranks(folder: str) -> dict:
    """This rank's chunks of `generate(PROMPTS, 4, SAMPLE, SEED)` on the tiny Qwen2 in `folder`, with where
    its engine sat."""
    from probepo.engines.vllm_engine import VLLMGenerationEngine

    job_ranks().export()
    distributed.join()
    engine = VLLMGenerationEngine(
        Path(folder), max_batch_rows=8, block_size=32, seed=0, enforce_eager=True, gpu_memory_utilization=0.15
    )
    backend = engine.llm.llm_engine.vllm_config.parallel_config.distributed_executor_backend
    placement = engine.placement()
    plan = engine.chunks(PROMPTS, 4)
    made = {}
    for index in distributed.claimed(list(range(len(plan)))):
        limits = [SAMPLE.max_tokens] * len(PROMPTS)
        [rows] = engine.decode_chunks(call_chunks(PROMPTS, limits, plan, [index], SEED), 4, SAMPLE)
        made[index] = [[(c.ids, c.finish_reason) for c in row] for row in rows]
    engine.close()
    survived = distributed.any_rank(True)  # a collective on the job's group, after vLLM stopped
    answer = {
        "rank": distributed.rank(),
        "gpu_index": gpu_index(),
        "backend": backend,
        "placement": placement,
        "made": made,
        "group_survived": survived,
    }
    distributed.leave()
    return answer
