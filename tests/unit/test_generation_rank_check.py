"""`probepo check`'s word on generation's ranks (checks/jobs.py): a generating job
with more ranks than the recipe's sample step has engine calls is warned of, naming the idle ranks and the
recipe to run instead (the preset in configs/ where there is one), since the calls are part of a recipe's
bits and never follow the ranks; a job whose ranks each get a call passes, and one-rank jobs say nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from probepo.checks.jobs import generation_rank_findings
from probepo.presets import load_profile, load_run_config
from slurm.executors import executor_for
from tests.pipeline.conftest import tiny_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TWO_NODES = CONFIGS / "profiles" / "h200-two-nodes.yaml"
STUDY_7B = CONFIGS / "deepseekmath-7b-sft.yaml"


def findings(recipe, profile: Path, executor: str):
    return generation_rank_findings(recipe, load_profile(profile), executor_for(executor).stages)


@pytest.mark.parametrize(
    ("executor", "jobs"),
    [
        ("resident", "stages.driver (16 ranks)"),
        ("slurm", "stages.sample (16 ranks), stages.probe (16 ranks), stages.evaluate (16 ranks)"),
    ],
)
def test_an_8_call_recipe_on_two_nodes_is_warned_of_and_told_its_two_node_preset(executor, jobs):
    recipe = load_run_config(STUDY_7B, {"store": "s3://team/runs"})  # a store of its own: the same recipe
    found = findings(recipe, TWO_NODES, executor)
    assert found.failures == [] and found.passed == []
    [warning] = found.warnings
    assert warning.startswith(
        f"generation: {jobs}, but the recipe's sample step makes 8 engine call(s) (sampling.shards = 8,"
        " sampling.batch_rows = 64): 8 rank(s) idle through every sample step."
    )
    assert (
        "run configs/deepseekmath-7b-sft-two-nodes.yaml (this recipe with --set sampling.shards=16"
        " --set sampling.batch_rows=32: samples other than this recipe's" in warning
    )
    assert warning.endswith("or give generation at most 8 ranks")


def test_the_two_node_preset_gives_every_rank_a_call_on_two_nodes_and_on_one():
    recipe = load_run_config(CONFIGS / "deepseekmath-7b-sft-two-nodes.yaml")
    for profile, ranks in ((TWO_NODES, 16), (CONFIGS / "profiles" / "h200-node.yaml", 8)):
        found = findings(recipe, profile, "resident")
        assert found.warnings == [] and found.passed == [
            "generation: the recipe's sample step makes 16 engine call(s) (sampling.shards = 16,"
            f" sampling.batch_rows = 32), one at least for each rank of stages.driver ({ranks} ranks)"
        ]


def test_a_recipe_without_a_two_node_preset_is_told_its_settings():
    [warning] = findings(load_run_config(CONFIGS / "qwen3-4b-base.yaml"), TWO_NODES, "resident").warnings
    assert "run this recipe with --set sampling.shards=16 --set sampling.batch_rows=32 (samples" in warning
    assert "configs/" not in warning


def test_fewer_prompts_than_ranks_are_told_to_take_fewer_ranks_and_one_rank_jobs_pass_unsaid():
    [warning] = findings(tiny_config(), TWO_NODES, "slurm").warnings  # 4 prompts, in one chunk and call
    assert "15 rank(s) idle" in warning and warning.endswith(": give generation at most 1 ranks")
    found = findings(tiny_config(), CONFIGS / "profiles" / "test-cluster.yaml", "slurm")
    assert found.warnings == found.passed == found.failures == []
    assert findings(load_run_config(STUDY_7B), TWO_NODES, "inline").warnings == []  # no job, one process
