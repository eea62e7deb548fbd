"""probepo/reference_update.py, the one-function reading of an update, against the committed pipeline: for
every method of the table (and ProbePO's random selector), one update of the tiny recipe trained inline
through the stages and the store, and the same update run in memory from the committed policy 0, give
bitwise the same rollouts, pivots, values, advantages, training rows and policy 1."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from safetensors.torch import load as load_safetensors

from probepo.config import RunConfig
from probepo.engines.base import TrainerEngine
from probepo.engines.build import load_trainer, new_generator
from probepo.methods import METHODS, method_for
from probepo.reference_update import UpdateResult, reference_update
from probepo.run.pipeline import train
from probepo.run.schedule import ADVANTAGES, PIVOTS, VALUES, Stage
from probepo.stages.batch import training_batch
from probepo.stages.common import read_rollouts, read_tensors
from probepo.stages.context import StageContext
from probepo.store import ArtifactStore
from tests.pipeline.conftest import tiny_config
from tests.pipeline.test_trees import TREE_FIELDS

pytestmark = pytest.mark.integration

RECIPES = {
    **{name: {"algorithm": name, **TREE_FIELDS.get(name, {})} for name in METHODS},
    "probepo-random": {"algorithm": "probepo", "selector": "random"},
}
"""The tiny recipe's algo fields per case: every method of the table (the tree baselines with their
test_trees.py settings, sized for the tiny ~21-token responses) and ProbePO's random-selector ablation."""


def recipe(case: str) -> RunConfig:
    """The tiny recipe (4 prompts × 4 responses) for one update under the case's algo fields."""
    config = tiny_config(num_updates=1)
    return config.model_copy(update={"algo": config.algo.model_copy(update=RECIPES[case])})


@dataclass(frozen=True)
class Both:
    """One update of a case, committed by the pipeline and run by reference_update."""

    ctx: StageContext
    """The pipeline's update 0 (its run in the store)."""
    result: UpdateResult
    trainer: TrainerEngine
    """The reference's trainer, started on the committed policy 0 and left on its policy 1."""


@pytest.fixture(scope="module", params=sorted(RECIPES))
def both(
    request: pytest.FixtureRequest, warm_store: ArtifactStore, tmp_path_factory: pytest.TempPathFactory
) -> Both:
    """Update 0 trained inline by the pipeline, and run by reference_update from the pipeline's committed
    policy 0 (weights and optimizer state)."""
    config = recipe(request.param)
    run_id = f"reference-{request.param.replace('_', '-')}"
    train(config, run_id, store=warm_store)
    scratch = tmp_path_factory.mktemp(run_id)
    policy = scratch / "policy-0"
    policy.mkdir()
    for name, data in warm_store.read_stage(run_id, 0, Stage.CHECKPOINT).items():
        (policy / name).write_bytes(data)
    trainer, generator = load_trainer(config, policy), new_generator(config, None, scratch)
    result = reference_update(config, 0, trainer, generator)
    return Both(StageContext(warm_store, run_id, 0, config, scratch), result, trainer)


def test_rollouts_pivots_and_values_are_the_committed_ones(both):
    ctx, result = both.ctx, both.result
    committed = read_rollouts(ctx)
    assert result.rollouts.responses == committed.responses
    assert result.rollouts.prompts == committed.prompts
    assert torch.equal(result.rollouts.group, committed.group)
    assert torch.equal(result.rollouts.rewards, committed.rewards)
    assert torch.equal(result.pivots, read_tensors(ctx, Stage.SELECT, PIVOTS)["pivot_pos"])
    assert torch.equal(result.values, read_tensors(ctx, Stage.PROBE, VALUES)["values"])
    # the recipe exercises the rules: mixed rewards, and a probing method places pivots
    assert 0 < float(committed.rewards.mean()) < 1
    assert bool((result.pivots >= 0).any()) == method_for(ctx.config.algo.algorithm).probes


def test_advantages_are_the_committed_ones(both):
    ctx, result = both.ctx, both.result
    committed = read_tensors(ctx, Stage.ADVANTAGE, ADVANTAGES)
    assert sorted(result.advantages) == sorted(committed)
    for name, tensor in committed.items():
        assert tensor.dtype == result.advantages[name].dtype, name
        assert torch.equal(result.advantages[name], tensor), name
    assert bool(committed["advantages"].any())


def test_training_rows_are_the_ones_optimize_trains_on(both):
    ctx, result = both.ctx, both.result
    committed = training_batch(ctx)
    assert result.batch.prompts == committed.prompts
    assert result.batch.responses == committed.responses
    for name in ("old_logp", "advantages", "loss_mask"):
        mine, theirs = getattr(result.batch, name), getattr(committed, name)
        assert (mine is None) == (theirs is None), name
        assert mine is None or (mine.dtype == theirs.dtype and torch.equal(mine, theirs)), name


def test_the_optimizer_step_makes_the_committed_policy_1(both):
    ctx, result = both.ctx, both.result
    summary = ctx.store.marker(ctx.run_id, 0, Stage.OPTIMIZE)["summary"]
    shared = sorted(set(summary) & set(result.metrics) - {"minibatches"})
    assert "loss" in shared and "grad_norm" in shared
    assert {key: result.metrics[key] for key in shared} == {key: summary[key] for key in shared}
    weights = both.trainer.weights()
    policy_1 = load_safetensors(ctx.store.read_stage(ctx.run_id, 1, Stage.CHECKPOINT)["model.safetensors"])
    policy_0 = load_safetensors(ctx.store.read_stage(ctx.run_id, 0, Stage.CHECKPOINT)["model.safetensors"])
    assert sorted(weights) == sorted(policy_1)
    assert all(torch.equal(weights[name], tensor) for name, tensor in policy_1.items())
    assert not all(torch.equal(weights[name], tensor) for name, tensor in policy_0.items())


def test_every_method_of_the_table_is_a_case():
    assert {fields["algorithm"] for fields in RECIPES.values()} == set(METHODS)
