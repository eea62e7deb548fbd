"""probepo.config.AlgoConfig: the study's recipe as defaults; invalid values rejected naming the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from probepo.config import AlgoConfig, RunConfig
from probepo.presets import with_overrides


def test_defaults_are_the_study_recipe():
    config = AlgoConfig()
    recipe = {
        "algorithm": "probepo",
        "advantage_scale": "std",  # §1: Bessel std + ε
        "advantage_eps": 1e-6,
        "selector": "entropy",
        "entropy_window": 8,  # §2.3: W = 8
        "margin": 8,  # §2.2 choice
        "max_pivots": 5,  # §2.4: 5 pivots × 8 continuations ≤ 40 per group
        "continuations_per_pivot": 8,
        "probe_budget": 40,
        "min_spacing": 16,  # §2.4 choice
        "kappa": 4.0,  # §3: κ = 4
        "residual_weight": 1.0,  # §4: λ = 1
        "residual_scale": "reward",
        "residual_std_floor": 0.1,
        "probe_uniform_groups": True,
        "rescue_suffix": "\n\nFinal answer: \\boxed{",
        "rescue_tokens": 32,
        "clip_low": 0.2,  # §5
        "clip_high": 0.2,
        "logratio_clamp": 20.0,
        "loss_agg": "token-mean",
        "kl_coef": 0.0,
        # the tree baselines at the study's settings (BASELINES.md)
        "spo_branching": (6, 6, 6),
        "spo_segment_tokens": 600,
        "spo_adv": "diff",
        "spo_prob_mask": 0.9,
        "treepo_segment_tokens": 512,
        "treepo_depth": 14,
        "treepo_width": 16,
        "treepo_first_fork": 2,
        "treepo_agg": "mean",
        "treepo_center": True,
    }
    assert config.model_dump() == recipe


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"kappa": -1.0}, "kappa"),
        ({"entropy_window": 0}, "entropy_window"),
        ({"min_spacing": 0}, "min_spacing"),
        ({"clip_low": 1.0}, "clip_low"),
        ({"advantage_eps": 0.0}, "advantage_eps"),
        ({"loss_agg": "sum"}, "loss_agg"),
        ({"selector": "greedy"}, "selector"),
        ({"kapa": 4.0}, "kapa"),  # a typo is an error, not a silently ignored field
        ({"max_pivots": 6}, "max_pivots"),  # 6 × 8 = 48 > 40
        ({"continuations_per_pivot": 16, "probe_budget": 64}, "probe_budget"),  # 5 × 16 = 80 > 64
        ({"algorithm": "spo"}, "algorithm"),
        ({"spo_branching": ()}, "spo_branching"),
        ({"spo_branching": (2, 0)}, "spo_branching"),
        ({"spo_prob_mask": 0.0}, "spo_prob_mask"),
        ({"spo_adv": "std"}, "spo_adv"),
        ({"treepo_width": 1}, "treepo_width"),
        ({"algorithm": "treepo", "treepo_first_fork": 4, "treepo_width": 3}, "treepo_first_fork"),
    ],
)
def test_invalid_values_name_the_field(values, field):
    with pytest.raises(ValidationError, match=field):
        AlgoConfig(**values)


def test_budget_rule_applies_to_probepo_only():
    # VinePPO probes every step boundary: the sparse budget does not bind it.
    assert AlgoConfig(algorithm="vineppo", max_pivots=6).max_pivots == 6
    assert AlgoConfig(max_pivots=6, probe_budget=48).max_pivots == 6
    assert AlgoConfig(max_pivots=0).max_pivots == 0  # zero pivots recover GRPO


def test_configs_are_immutable_and_overrides_are_validated():
    config = AlgoConfig()
    with pytest.raises(ValidationError, match="frozen"):
        config.kappa = -0.5
    assert config.kappa == 4.0
    run = RunConfig()
    assert with_overrides(run, **{"algo.kappa": 0.0}).algo.kappa == 0.0
    with pytest.raises(ValidationError, match="max_pivots"):
        with_overrides(run, **{"algo.max_pivots": 6})  # 6 × 8 exceeds the budget of 40


def test_checkpoint_every_is_validated_and_not_part_of_the_recipe():
    from probepo.run.pipeline import run_record
    from probepo.run.schedule import full_checkpoint

    with pytest.raises(ValidationError, match="checkpoint_every"):
        RunConfig(checkpoint_every=0)
    every_3 = RunConfig(checkpoint_every=3, store="elsewhere")
    assert run_record(every_3) == run_record(RunConfig())  # where and how often in full: not the recipe
    assert every_3.recipe_json() == RunConfig().recipe_json()
    assert [k for k in range(8) if full_checkpoint(k, num_updates=7, every=3)] == [0, 3, 6, 7]


def test_the_vllm_generator_needs_a_hugging_face_model():
    with pytest.raises(ValidationError, match="needs model\\.kind = hf"):
        RunConfig.model_validate({"model": {"generator": "vllm"}})
    hf = {"kind": "hf", "pretrained": "x", "generator": "vllm"}
    with pytest.raises(ValidationError, match="vllm_memory"):
        RunConfig.model_validate({"task": {"kind": "math"}, "model": {**hf, "vllm_memory": 0}})
    model = RunConfig.model_validate({"task": {"kind": "math"}, "model": hf}).model
    assert (model.generator, model.vllm_memory) == ("vllm", None)


def test_the_deepspeed_trainer_needs_a_hugging_face_model():
    with pytest.raises(ValidationError, match=r"model\.trainer = deepspeed needs model\.kind = hf"):
        RunConfig.model_validate({"model": {"kind": "testbed", "trainer": "deepspeed"}})
    with pytest.raises(ValidationError, match="zero_stage"):
        RunConfig.model_validate(
            {"model": {"kind": "hf", "pretrained": "x", "trainer": "deepspeed", "zero_stage": 1}}
        )
