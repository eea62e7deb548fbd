"""Two ranks, an engine each: a local job of two tasks (ranks in one process group, as in a stage job)
builds a vLLM engine per rank with the external_launcher executor (vLLM's "external data parallel": each
rank an independent replica on its own device, LOCAL_RANK), splits the chunks of a call between them by
claiming, and makes exactly what one engine makes alone; stopping the engines leaves the job's group alive.

Runs where vLLM imports: `bash scripts/test-vllm.sh`."""

from __future__ import annotations

import pytest

from tests.hf.test_generation import PROMPTS, SAMPLE
from tests.vllm.ranks_job import SEED, generate_on_ranks

pytest.importorskip("vllm", reason="vLLM tier: run `bash scripts/test-vllm.sh`")


def test_two_ranks_with_an_engine_each_make_what_one_engine_makes(tiny_qwen, tmp_path):
    import submitit

    from probepo.engines.vllm_engine import VLLMGenerationEngine

    executor = submitit.LocalExecutor(folder=tmp_path / "jobs")
    executor.update_parameters(tasks_per_node=2, timeout_min=15)
    answers = executor.submit(generate_on_ranks, str(tiny_qwen.folder)).results()

    assert [a["rank"] for a in answers] == [0, 1]
    for answer in answers:
        assert answer["backend"] == "external_launcher" and answer["group_survived"]
        # vLLM's world is the job's two ranks, each engine built on its rank's device index
        assert answer["placement"] == (answer["rank"], answer["gpu_index"])
    made = {c: rows for a in answers for c, rows in a["made"].items()}
    assert sum(len(a["made"]) for a in answers) == len(made)  # no chunk made twice

    alone = VLLMGenerationEngine(
        tiny_qwen.folder,
        max_batch_rows=8,
        block_size=32,
        seed=0,
        enforce_eager=True,
        gpu_memory_utilization=0.15,
    )
    try:
        whole = alone.generate(PROMPTS, 4, SAMPLE, SEED)
        plan = alone.chunks(PROMPTS, 4)
    finally:
        alone.close()
    assert sorted(made) == list(range(len(plan)))
    for index, chunk in enumerate(plan):
        assert made[index] == [[(c.ids, c.finish_reason) for c in whole[i]] for i in chunk]
