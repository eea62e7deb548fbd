"""The DeepSpeed trainer on two ranks (gloo on CPU) against the Hugging Face engine: two PPO-clip updates
of the tiny Qwen2 model with non-zero advantages, under ZeRO-2 and then ZeRO-3, in one SLURM job of two
tasks (test_pipeline.py runs ZeRO-3 in local two-task jobs). Losses, gradient norms and weights match the
single-process engine's within a stated tolerance (the ranks sum the gradient in another order), and an
engine resumed from the checkpoint written after the first update ends bitwise equal to the one that ran
straight through."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from probepo.config import AlgoConfig
from tests.deepspeed.ranks_job import OPTIM, RESPONSE_BUDGET, two_updates, two_updates_on_ranks

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

LOSS_RTOL = 1e-5
"""Relative tolerance of each update's loss and gradient norm (measured: ~1e-6)."""
WEIGHT_ATOL = 2e-5
"""Absolute tolerance of the final weights (measured: ~3e-6), 0.5 % of what two updates change them by."""


@pytest.fixture(scope="module")
def hugging_face(tiny_qwen):
    """The single-process engine's metrics and final weights on the same two updates."""
    from probepo.engines.hf import HFTrainerEngine, load_policy

    model, _ = load_policy(tiny_qwen.folder)
    engine = HFTrainerEngine(model, OPTIM, AlgoConfig(), response_budget=RESPONSE_BUDGET)
    metrics, engine = two_updates(engine)
    return metrics, engine.weights(), load_policy(tiny_qwen.folder)[0].state_dict()


@pytest.fixture(scope="module")
def on_two_slurm_ranks(tiny_qwen, slurm_cluster, tmp_path_factory):
    """Both ZeRO stages in one SLURM job of two tasks: each rank's results, and the job's output folder."""
    import submitit

    out = tmp_path_factory.mktemp("zero")
    executor = submitit.SlurmExecutor(folder=out / "jobs", max_num_timeout=0)
    executor.update_parameters(partition="low", ntasks_per_node=2, cpus_per_task=1, time=10)
    yield executor.submit(two_updates_on_ranks, str(tiny_qwen.folder), [2, 3], str(out)).results(), out
    shutil.rmtree(out)  # checkpoints with optimizer shards: hundreds of MB


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_two_ranks_in_one_slurm_job_match_the_hugging_face_engine_and_resume_bitwise(
    zero_stage, on_two_slurm_ranks, hugging_face
):
    metrics, weights, initial = hugging_face
    results, out = on_two_slurm_ranks
    results = [r for per_rank in results for r in per_rank if r["zero_stage"] == zero_stage]
    assert sorted(r["rank"] for r in results) == [0, 1] and {r["world_size"] for r in results} == {2}
    for result in results:
        for ours, theirs in zip(result["metrics"], metrics, strict=True):
            assert ours["minibatches"] == theirs["minibatches"] == 2
            for key in ("loss", "grad_norm", "entropy", "ratio_mean", "approx_kl"):
                assert ours[key] == pytest.approx(theirs[key], rel=LOSS_RTOL, abs=1e-7), key
        assert result["resumed_metrics"] == result["metrics"] and result["resumed_bitwise"]
        assert result["shard_tensors"] > 0
        assert result["live_weights_are_the_copy"] and result["fingerprint_of_the_copy"]
    final = load_file(out / f"zero{zero_stage}" / "final.safetensors")
    changed = max(float((weights[k] - initial[k]).abs().max()) for k in final)
    assert changed > 100 * WEIGHT_ATOL  # the updates moved the weights
    for name, tensor in final.items():
        torch.testing.assert_close(tensor, weights[name], rtol=0, atol=WEIGHT_ATOL)
    files = set(results[0]["files"])
    shards = {f"optimizer-rank-0000{r}-of-00002.{ext}" for r in (0, 1) for ext in ("safetensors", "json")}
    assert shards <= files and {"model.safetensors", "config.json", "trainer.json"} <= files
    assert not {name for name in files if name.endswith((".pt", ".bin", ".pkl"))}
    saved = load_file(out / f"zero{zero_stage}" / "after-update-1" / "model.safetensors")
    assert "lm_head.weight" not in saved and "model.embed_tokens.weight" in saved  # tied: stored once
    meta = json.loads((out / f"zero{zero_stage}" / "after-update-1" / "trainer.json").read_text())
    assert meta["world_size"] == 2 and meta["optimizer_steps"] == 2 and meta["zero_stage"] == zero_stage


def test_a_checkpoint_of_two_ranks_is_refused_on_one_naming_what_to_resume_with(
    on_two_slurm_ranks, tiny_qwen
):
    from probepo.engines.deepspeed_engine import DeepSpeedTrainerEngine
    from probepo.engines.hf import load_policy
    from probepo.run import distributed

    _, out = on_two_slurm_ranks
    checkpoint = out / "zero2" / "after-update-1"
    model, _ = load_policy(checkpoint)
    try:
        engine = DeepSpeedTrainerEngine(
            model, OPTIM, AlgoConfig(), zero_stage=2, response_budget=RESPONSE_BUDGET
        )
        with pytest.raises(
            ValueError, match=r"ZeRO-2 optimizer shards of 2 ranks; this job runs ZeRO-2 on 1"
        ):
            engine.load(checkpoint)
    finally:
        distributed.leave()
