"""`probepo check`'s memory of every job that loads the model (probepo/checks/memory.py, evaluation.py)
and its evaluation shards against the jobs' grace windows (stages/evaluate.py), on the study's DeepSeekMath-7B
recipe with the shipped 8×H200 profile: the numbers DeepSpeed 0.19.8's allocations give, a job that cannot
fit refused with what to change, and the shard plan's cut, which moves no chunk."""

from __future__ import annotations

from pathlib import Path

import pytest

from probepo.checks.evaluation import evaluation_shard_findings
from probepo.checks.findings import Findings
from probepo.checks.memory import memory_findings
from probepo.config import ExecutionProfile, RunConfig
from probepo.engines.sampler import call_plan
from probepo.presets import load_profile, load_run_config, with_overrides
from probepo.spend.model import GB, trainer_peaks
from probepo.stages.evaluate import EVAL_SHARD_SECONDS, EVAL_SHARD_TOKENS, largest_shard
from probepo.stages.shards import calls_within
from slurm.executors import executor_for
from tests.pipeline.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[2]
DEEPSEEKMATH = load_run_config(ROOT / "configs" / "deepseekmath-7b-sft.yaml")
H200_NODE = load_profile(ROOT / "configs" / "profiles" / "h200-node.yaml")
PARAMETERS = 6_900_000_000
"""DeepSeekMath-7B's parameters, as its weights' headers would give them (about 6.9 B)."""


def _checked(profile: ExecutionProfile, executor: str, config: RunConfig = DEEPSEEKMATH) -> Findings:
    chosen = executor_for(executor)
    return memory_findings(config, profile, chosen, PARAMETERS).extend(
        evaluation_shard_findings(config, profile, chosen)
    )


def _with(profile: ExecutionProfile, stage: str, **fields: object) -> ExecutionProfile:
    data = profile.model_dump(exclude_unset=True)
    data["stages"] = {**data["stages"], stage: {**data["stages"].get(stage, {}), **fields}}
    return ExecutionProfile.model_validate(data)


def _without(profile: ExecutionProfile, stage: str) -> ExecutionProfile:
    data = profile.model_dump(exclude_unset=True)
    data["stages"] = {name: fields for name, fields in data["stages"].items() if name != stage}
    return ExecutionProfile.model_validate(data)


def _lines(found: Findings, start: str) -> list[str]:
    return [line for line in found.failures + found.warnings + found.passed if line.startswith(start)]


def test_deepspeed_zero2_peaks_at_init_and_at_the_first_step_as_its_source_allocates():
    peaks = trainer_peaks(DEEPSEEKMATH, PARAMETERS, 8, "training", on_gpu=True)
    gb = {
        when: {name: round(value / GB, 3) for name, value in parts.items()} for when, parts in peaks.items()
    }
    # bf16 weights whole on each rank, each rank's fp32 masters (4 bytes / 8 ranks) and, at init, the fp32
    # gradient partition DeepSpeed allocates and frees; at the step, AdamW's moments and its temporary too
    assert gb == {
        "at DeepSpeed's init": {"weights": 13.8, "fp32 masters": 3.45, "fp32 gradient partition": 3.45},
        "at the first optimizer step": {
            "weights": 13.8,
            "fp32 masters": 3.45,
            "gradient partition": 1.725,
            "fp32 gradients": 3.45,
            "AdamW moments": 6.9,
            "AdamW's step temporaries": 3.45,
        },
    }
    on_cpu = trainer_peaks(DEEPSEEKMATH, PARAMETERS, 8, "training", on_gpu=False)  # torch's slower path
    assert on_cpu["at the first optimizer step"]["AdamW's step temporaries"] == 2 * 3.45e9
    fresh = trainer_peaks(DEEPSEEKMATH, PARAMETERS, 1, "fresh", on_gpu=False)  # checkpoint 0: never steps
    assert list(fresh) == ["at DeepSpeed's init"] and sum(fresh["at DeepSpeed's init"].values()) == 69e9
    zero3 = with_overrides(DEEPSEEKMATH, **{"model.zero_stage": 3})
    peaks = trainer_peaks(zero3, PARAMETERS, 8, "training", on_gpu=True)
    assert peaks["when moved to the device, before partitioning"] == {"weights": 13.8e9}
    # 1/8 of the bf16 weights and their gradients, masters, fp32 gradients, moments and a temporary
    assert sum(peaks["at the first optimizer step"].values()) == pytest.approx(24 * PARAMETERS / 8)


def test_checkpoint_0_on_the_profiles_cpu_defaults_is_refused_naming_what_to_change():
    """Per stage, checkpoint 0 builds the 7B DeepSpeed trainer in the profile's defaults unless a
    `stages.checkpoint` entry says otherwise: one CPU task of 64 GB, where DeepSpeed puts its fp32 masters
    and gradient partition beside the bf16 weights. The shipped profile gives it 128 GB."""
    shipped = _checked(H200_NODE, "slurm")
    assert shipped.failures == [] and shipped.warnings == []
    (host,) = _lines(shipped, "memory of checkpoint: about 69.0 GB")
    assert host.endswith("within the mem_gb 128 of stages.checkpoint")
    defaults = _without(H200_NODE, "checkpoint")
    (failure,) = _checked(defaults, "slurm").failures
    assert failure == (
        "memory of checkpoint: about 69.0 GB of host memory per node (1 rank(s) × 69.0 GB at DeepSpeed's"
        " init, without a GPU: weights 13.8, fp32 masters 27.6, fp32 gradient partition 27.6): MORE than the"
        " mem_gb 64 of defaults; give checkpoint mem_gb ≥ 69 and room for the processes' own (a"
        " `stages.checkpoint` entry of the profile) or a GPU for its trainer (gpus_per_node: 1 and"
        " gpu_memory_gb in `stages.checkpoint`)"
    )
    assert _checked(_with(defaults, "checkpoint", mem_gb=96), "slurm").failures == []
    on_gpu = _checked(_with(defaults, "checkpoint", gpus_per_node=1, gpu_memory_gb=141), "slurm")
    assert on_gpu.failures == []
    (gpu,) = _lines(on_gpu, "memory of checkpoint: the trainer")
    assert gpu.startswith("memory of checkpoint: the trainer (ZeRO-2) builds checkpoint 0 with the 6.90 B")
    assert "about 69.0 GB per GPU at DeepSpeed's init" in gpu and gpu.endswith("of each 141 GB GPU")
    (host,) = _lines(on_gpu, "memory of checkpoint: about")
    assert host.startswith("memory of checkpoint: about 13.8 GB of host memory per node")
    # rank 0 alone builds it: more ranks or ZeRO-3 would not shard it
    (small,) = _checked(_with(defaults, "checkpoint", gpus_per_node=1, gpu_memory_gb=40), "slurm").failures
    assert small.endswith(
        "MORE than the 40.0 GB of each 40 GB GPU; give checkpoint GPUs with more memory, or none and mem_gb"
        " ≥ 69 (`stages.checkpoint`)"
    )


@pytest.mark.parametrize(
    ("executor", "jobs"),
    [
        ("slurm", ["checkpoint", "evaluate", "sample", "score", "probe", "optimize", "eval_task"]),
        ("resident", ["driver", "eval_task"]),
        ("inline", []),
    ],
)
def test_every_job_that_loads_the_model_gets_its_lines(executor, jobs):
    found = _checked(H200_NODE, executor)
    hosts = [line.split(":")[0].removeprefix("memory of ") for line in _lines(found, "memory of ")]
    assert sorted(set(hosts)) == sorted(jobs)
    assert len(_lines(found, "memory: ")) == (executor != "inline")  # the trainer's, as it always was
    assert len(_lines(found, "evaluation shards: ")) == (executor != "inline")
    grpo = _checked(H200_NODE, executor, with_overrides(DEEPSEEKMATH, **{"algo.algorithm": "grpo"}))
    assert not _lines(grpo, "memory of probe")  # a method that does not probe runs no probe job


def test_the_resident_driver_leaves_vllm_its_share_of_each_gpu():
    found = _checked(H200_NODE, "resident")
    (trainer,) = _lines(found, "memory: ")
    assert trainer.startswith(
        "memory: 6.90 B parameters train on 8 GPU(s) with ZeRO-2: about 32.8 GB per GPU at the first"
        " optimizer step (weights 13.8, fp32 masters 3.5, gradient partition 1.7, fp32 gradients 3.5, AdamW"
        " moments 6.9, AdamW's step temporaries 3.5) before activations"
    )
    # vLLM sleeps while the trainer trains: its peak has the GPU but the margin
    assert trainer.endswith("leaving the 135.0 GB of each 141 GB GPU while vLLM sleeps, less the 6 GB margin")
    (vllm,) = _lines(found, "memory of driver: vLLM")
    # computed (tests/unit/test_kv_cache_check.py): 1 - (25.9 GB resident + 6 GB margin) / 141 = 0.77
    assert vllm == (
        "memory of driver: vLLM (77% of each GPU, computed: model.vllm_memory unset) holds the weights, 13.8"
        " GB, on each of 8 GPU(s): leaving the 108.6 GB it is given of each 141 GB GPU, 94.8 GB of it for its"
        " KV cache"
    )
    small = _checked(_with(H200_NODE, "driver", gpu_memory_gb=30), "resident").failures
    assert len(small) == 2
    assert small[0].endswith(
        "MORE than the 24.0 GB of each 30 GB GPU while vLLM sleeps, less the 6 GB margin; shard further"
        " (model.zero_stage: 3) or add ranks (nodes × tasks_per_node of stages.driver)"
    )
    assert small[1].startswith("memory of driver: vLLM (0% of each GPU, computed: model.vllm_memory unset)")
    assert _checked(_with(H200_NODE, "driver", mem_gb=100), "resident").failures == [
        "memory of driver: about 110.4 GB of host memory per node (8 rank(s) × 13.8 GB as loaded, before they"
        " move to the GPU: weights 13.8): MORE than the mem_gb 100 of stages.driver; give driver mem_gb ≥ 111"
        " and room for the processes' own (a `stages.driver` entry of the profile) or fewer tasks_per_node"
    ]


def test_a_job_whose_profile_gives_no_figure_is_shown_not_compared():
    found = _checked(_with(H200_NODE, "score", mem_gb=None, gpu_memory_gb=None), "slurm")
    (score_gpu,) = _lines(found, "memory of score: the trainer")
    assert score_gpu in found.warnings
    assert score_gpu.endswith("; give the profile's gpu_memory_gb to compare it with the GPUs")
    (score_host,) = _lines(found, "memory of score: about")
    assert score_host in found.passed
    assert score_host.endswith("; stages.score sets no mem_gb (the partition's default): not compared")


def test_evaluation_shards_fit_the_evaluate_jobs_grace_and_a_shorter_one_is_warned_about():
    shard = largest_shard(DEEPSEEKMATH)  # 4 problems x Mean@16 = 64 rows a chunk, 1,024 tokens a row
    assert (shard.chunks, shard.rows, shard.tokens) == (4, 256, 262_144)
    assert shard.tokens <= EVAL_SHARD_TOKENS and shard.seconds <= EVAL_SHARD_SECONDS
    (line,) = _checked(H200_NODE, "slurm").passed[-1:]
    assert line.startswith("evaluation shards: at most 256 rows (math500: 4 chunk(s)), their 262,144 tokens")
    assert "~87 s and one row's ~15 s at 3,000 and 70 tokens/s" in line
    assert line.endswith(
        "evaluate's signal_grace_s 120 (stages.evaluate) holds one: a stop commits the shard in flight before"
        " the kill"
    )
    (short,) = _checked(_with(H200_NODE, "evaluate", signal_grace_s=60), "slurm").warnings[-1:]
    assert short.endswith(
        "evaluate's signal_grace_s 60 (stages.evaluate) is shorter than a shard: a stop may lose the one in"
        " flight (made again on resume): raise signal_grace_s (and the partition's GraceTime) above 88 s"
    )
    (row,) = _checked(_with(H200_NODE, "driver", signal_grace_s=10), "resident").warnings[-1:]
    assert "driver's signal_grace_s 10 (stages.driver) is shorter than one row" in row
    assert row.endswith("above 15 s, or lower sampling.max_tokens")


def test_a_plan_that_fits_its_budget_is_the_plan_as_it_was():
    calls = call_plan(10, 3)  # chunks dealt back and forth into 3 calls
    assert calls_within(calls, [5] * 10, 20) == calls
    cut = calls_within(calls, [5] * 10, 10)  # at most 2 chunks a call, each call's chunks in order
    assert cut == [[0, 5], [6], [1, 4], [7], [2, 3], [8, 9]]
    assert sorted(c for call in cut for c in call) == list(range(10))
    assert calls_within([[0, 1, 2]], [30, 5, 5], 10) == [[0], [1, 2]]  # a chunk over it stands alone
    testbed = largest_shard(tiny_config())  # 16 problems of 64 tokens at most: its one call, whole
    assert (testbed.chunks, testbed.rows, testbed.tokens) == (1, 16, 16 * 64)
