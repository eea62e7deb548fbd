"""`probepo check`'s word on a recipe for GPUs (its generator vLLM or its trainer DeepSpeed) on a profile
that gives its jobs no GPU (probepo.checks.jobs.gpu_findings): a warning naming the jobs, as when a site's
only profile, a CPU cluster's, is what the 7B recipe's train deployment opens on; a GPU profile, a CPU
recipe and an executor that runs no jobs say nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from probepo.checks.jobs import gpu_findings
from probepo.presets import load_profile, load_run_config
from slurm.executors import executor_for

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CPU_CLUSTER, H200 = CONFIGS / "profiles" / "test-cluster.yaml", CONFIGS / "profiles" / "h200-node.yaml"


@pytest.mark.parametrize(
    ("executor", "jobs"),
    [("resident", "driver, eval_task"),
     ("slurm", "checkpoint, evaluate, sample, score, probe, optimize, eval_task")],
)  # fmt: skip
def test_a_gpu_recipe_on_a_profile_without_gpus_is_warned_of_naming_its_jobs(executor, jobs):
    found = gpu_findings(
        load_run_config(CONFIGS / "deepseekmath-7b-sft.yaml"),
        load_profile(CPU_CLUSTER),
        executor_for(executor),
    )
    assert found.failures == [] and found.passed == []
    assert found.warnings == [
        f"GPUs: the profile gives none to the jobs that load the model ({jobs}), yet the recipe's generator"
        " vllm and trainer deepspeed run on GPUs: choose a profile with GPUs (a train deployment opens on the"
        " site file's `profile`; its `profiles` are the others its form offers)"
    ]


@pytest.mark.parametrize(
    ("recipe", "profile", "executor"),
    [("deepseekmath-7b-sft", H200, "resident"),  # its GPUs (checkpoint 0 on the CPU by design: said nothing)
     ("deepseekmath-7b-sft", H200, "slurm"),
     ("deepseekmath-7b-sft", CPU_CLUSTER, "inline"),  # no jobs: this machine's engines
     ("cpu-smollm2", CPU_CLUSTER, "slurm")],  # a Hugging Face model for the CPU
)  # fmt: skip
def test_a_gpu_profile_a_cpu_recipe_or_no_jobs_say_nothing(recipe, profile, executor):
    found = gpu_findings(
        load_run_config(CONFIGS / f"{recipe}.yaml"), load_profile(profile), executor_for(executor)
    )
    assert found.warnings == found.failures == found.passed == []
