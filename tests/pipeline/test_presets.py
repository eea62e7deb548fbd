"""The presets in configs/ load, and the embedded default is exactly RunConfig's defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from probepo.config import RunConfig
from probepo.presets import load_profile, load_run_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_cpu_demo_preset_is_the_embedded_default():
    assert load_run_config(CONFIGS / "cpu-demo.yaml") == RunConfig()


@pytest.mark.parametrize("preset", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_preset_is_valid(preset):
    assert isinstance(load_run_config(preset), RunConfig)


def test_dotted_overrides_and_errors_name_the_file_and_field(tmp_path):
    config = load_run_config(CONFIGS / "cpu-demo.yaml", {"algo.kappa": 0.0, "num_updates": 3})
    assert config.algo.kappa == 0.0 and config.num_updates == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo:\n  windw: 8\n")
    with pytest.raises(ValueError, match=r"bad\.yaml(.|\n)*algo\.windw"):
        load_run_config(bad)
    with pytest.raises(ValueError, match="rescue_suffix"):
        load_run_config(CONFIGS / "cpu-demo.yaml", {"algo.rescue_suffix": "\\boxed{"})


@pytest.mark.parametrize("path", sorted((CONFIGS / "profiles").glob("*.yaml")), ids=lambda p: p.name)
def test_every_execution_profile_is_valid(path):
    profile = load_profile(path)
    assert profile.resources("optimize").time_min >= 1


STUDY_RECIPES = {
    "deepseekmath-7b-sft.yaml": 1000,
    "r1-distill-qwen-1.5b.yaml": 1000,
    "qwen3-4b-base.yaml": 27,
}


@pytest.mark.parametrize(("name", "updates"), STUDY_RECIPES.items())
def test_the_study_recipes_hold_the_study_values_and_mark_ours(name, updates):
    from probepo.data.benchmarks import AVG6_BENCHMARKS

    config, text = load_run_config(CONFIGS / name), (CONFIGS / name).read_text()
    algo = config.algo
    assert (config.num_updates, config.group_size, config.prompts_per_update) == (updates, 8, 64)
    assert (algo.algorithm, algo.max_pivots, algo.continuations_per_pivot, algo.kappa) == (
        "probepo",
        5,
        8,
        4.0,
    )
    assert algo.residual_weight == 1.0 and algo.probe_budget == 40 and algo.rescue_tokens > 0
    assert config.eval.benchmarks == AVG6_BENCHMARKS and updates % config.eval.every == 0  # terminal eval
    assert config.model.kind == "hf" and config.task.kind == "math"
    lines = {line.split(":")[0].strip(): line for line in text.splitlines() if ":" in line}
    for key in ("lr", "minibatch_size", "microbatch_size", "dtype", "temperature", "margin", "min_spacing"):
        assert "# choice" in lines[key], f"{name}: {key} is ours, not the study's: mark it"
    if name.startswith("r1-"):
        assert config.sampling.context == 2048  # the study's binding 2K context, with cutoff rescue
    else:
        assert "# choice" in lines["max_tokens"]
    profile = load_profile(CONFIGS / "profiles" / "h200-node.yaml")
    assert "configs/profiles/h200-node.yaml" in text and profile.resources("sample").gpus_per_node == 8
    two = load_profile(CONFIGS / "profiles" / "h200-two-nodes.yaml")
    trainer = [two.resources(stage) for stage in ("score", "optimize", "driver")]
    assert {(r.nodes, r.tasks_per_node) for r in trainer} == {(2, 8)}  # one world size: shards resume
    assert (two.resources("select").nodes, two.resources("eval_task").nodes) == (1, 1)
