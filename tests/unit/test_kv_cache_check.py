"""vLLM's share of each GPU computed from what the trainer keeps resident (spend/model.py `generation_share`)
and `probepo check`'s KV-cache lines (probepo/checks/kv_cache.py), on the study's recipes and the shipped
8×H200 profile (141 GB GPUs).

By hand, bf16 weights (2 bytes a parameter), DeepSpeed's fp32 masters (4) and AdamW moments (8) sharded over
W ranks, a gradient partition in bf16 (2 / W); between optimizer steps under ZeRO-2 each rank keeps
P × (2 + 4/W + 8/W + 2/W) bytes (more than DeepSpeed's init peak, P × (2 + 4/W + 4/W)), plus the 6 GB margin:
- DeepSeekMath-7B (6.9 B), W = 8: 6.9 × 3.75 = 25.9 GB; 1 - 31.9 / 141 = 0.774 → 0.77 (0.35 before);
- DeepSeekMath-7B on two nodes, W = 16: 6.9 × 2.875 = 19.8 GB; 1 - 25.8 / 141 = 0.817 → 0.81;
- Qwen3-4B-Base (4.0 B), W = 8: 15.0 GB; 1 - 21.0 / 141 = 0.851 → 0.85;
- R1-Distill-Qwen-1.5B (1.8 B), W = 8: 6.75 GB; 1 - 12.75 / 141 = 0.909 → 0.90.
Optimizer offloaded between phases (DeepSeekMath, W = 8): the init peak binds, 6.9 × 3 = 20.7 GB: 0.81.

DeepSeekMath-7B's KV cache: 30 layers × 32 KV heads (no grouped-query attention) × 128 × 2 × 2 bytes =
491,520 bytes a token. At 0.77: 108.57 GB less 13.8 of weights and 2 of activations = 92.77 GB, 11,796
blocks of 16: 188,736 tokens (≈ 33 GB and 68 K tokens at 0.35).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from probepo.checks.kv_cache import KVLayout, engine_calls, job_findings
from probepo.config import StageResources
from probepo.presets import load_profile, load_run_config, with_overrides
from probepo.run.schedule import Stage
from probepo.spend.model import generation_share

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
DEEPSEEKMATH = load_run_config(CONFIGS / "deepseekmath-7b-sft.yaml")
H200_NODE = load_profile(CONFIGS / "profiles" / "h200-node.yaml")
DRIVER = H200_NODE.resources(Stage.DRIVER)
DSM_KV = KVLayout(layers=30, kv_heads=32, head_dim=128, width=2)
PROMPT, RESCUE = 200, 40
"""A longest prompt and a probe's rescue (suffix and rescue tokens), in tokens."""


@pytest.mark.parametrize(
    ("recipe", "parameters", "ranks", "share"),
    [
        ("deepseekmath-7b-sft.yaml", 6_900_000_000, 8, 0.77),
        ("deepseekmath-7b-sft-two-nodes.yaml", 6_900_000_000, 16, 0.81),
        ("qwen3-4b-base.yaml", 4_000_000_000, 8, 0.85),
        ("r1-distill-qwen-1.5b.yaml", 1_800_000_000, 8, 0.90),
    ],
)
def test_the_share_is_what_the_trainer_leaves_of_an_h200(
    recipe: str, parameters: int, ranks: int, share: float
):
    config = load_run_config(CONFIGS / recipe)
    assert config.model.vllm_memory is None  # computed
    assert generation_share(config, parameters, 141, ranks) == share


def test_offload_and_no_trainer_leave_more_and_a_small_gpu_nothing():
    assert generation_share(DEEPSEEKMATH, 6_900_000_000, 141, 8, offload_optimizer=True) == 0.81
    assert generation_share(DEEPSEEKMATH, 6_900_000_000, 141, 0) == 0.95  # 1 - 6 / 141: the margin alone
    assert generation_share(DEEPSEEKMATH, 6_900_000_000, 30, 8) == 0.0


def test_the_kv_lines_of_the_resident_driver():
    found = job_findings(
        DEEPSEEKMATH, 6_900_000_000, DSM_KV, engine_calls(DEEPSEEKMATH, PROMPT, RESCUE), Stage.DRIVER, DRIVER
    )
    assert not found.failures
    head, sample = found.passed
    assert head.startswith(
        "KV cache of driver: vLLM's 0.77 of each 141 GB GPU (computed: model.vllm_memory unset), less the"
        " weights 13.8 GB and 2 GB of activations, holds 188,736 tokens (0.49 MB a token: 30 layers × 32 KV"
        " heads × 128 × 2 (keys, values) × 2 bytes)"
    )
    assert "the optimizer shard offloaded to host between phases would give vLLM 0.81" in head
    # 8 prompts × 8 samples: 8 × 12 shared blocks + 64 × (77 - 12) own blocks
    assert sample == (
        "KV cache of driver, sample: one engine call of 64 rows (8 prefixes × 8, up to 200 + 1024 tokens"
        " each, a prefix's samples sharing its blocks) needs 68,096 tokens of the 188,736: all 64 rows at"
        " once"
    )
    # probe: 64 prompts × 5 pivots = 40 chunks of 8 pivots dealt into 8 calls: 40 prefixes × 8 a call
    probe, evaluate = found.warnings
    assert probe.startswith("KV cache of driver, probe: one engine call of 320 rows (40 prefixes × 8")
    assert (
        "needs 350,720 tokens, MORE than the 188,736 its KV cache holds: 172 of its 320 rows fit at once"
        in probe
    )
    assert probe.endswith(
        "raise sampling.shards (fewer rows a call), lower sampling.max_tokens, or give vLLM a larger share"
        " (model.vllm_memory)"
    )
    assert evaluate.startswith("KV cache of driver, evaluate: one engine call of 256 rows")


def test_a_row_that_cannot_fit_fails_and_an_override_past_the_trainer_too():
    small = StageResources.model_validate({**DRIVER.model_dump(), "gpu_memory_gb": 20})
    tight = with_overrides(DEEPSEEKMATH, **{"model.vllm_memory": 0.8})  # 16 - 13.8 - 2 GB: 400 tokens
    found = job_findings(
        tight, 6_900_000_000, DSM_KV, engine_calls(tight, PROMPT, RESCUE), Stage.DRIVER, small
    )
    past, *rows = found.failures
    assert past.startswith(
        "KV cache of driver: model.vllm_memory 0.80 of each 20 GB GPU leaves its trainer 4.0 GB"
    )
    assert past.endswith("lower model.vllm_memory to 0.00 or below, or unset it (computed)")
    assert len(rows) == 3
    assert rows[0].endswith(
        "and one row alone 1,232: MORE than the 400 its KV cache holds; lower sampling.max_tokens, give vLLM"
        " a larger share (model.vllm_memory), or use GPUs with more memory"
    )
    alone = StageResources.model_validate(
        {**H200_NODE.resources(Stage.SAMPLE).model_dump(), "gpu_memory_gb": 20}
    )
    found = job_findings(
        tight, 6_900_000_000, DSM_KV, engine_calls(tight, PROMPT, RESCUE), Stage.SAMPLE, alone
    )
    assert len(found.failures) == 1  # no trainer beside a sample job: only its row
