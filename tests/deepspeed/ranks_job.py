"""Job functions for the DeepSpeed tests, run on every rank of a two-task job (submitit's local executor
or SLURM): each exports its rank environment and joins the job's gloo group first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from probepo.config import AlgoConfig, OptimConfig
from probepo.engines.base import TrainBatch, TrainerEngine
from probepo.engines.fingerprint import weights_fingerprint

OPTIM = OptimConfig(lr=1e-3, minibatch_size=4, microbatch_size=1, epochs=1, grad_clip=1.0)
"""8 rows per update: 2 mini-batches of 4 micro-batches of one row; on 2 ranks each accumulates 2."""
RESPONSE_BUDGET = 12


def tiny_batch(seed: int = 0) -> tuple[list[list[int]], list[list[int]], torch.Tensor]:
    """8 prompts of 3-6 tokens, responses of 2-7 tokens (ids the tiny model was trained on), and a
    non-zero advantage per response, [8, RESPONSE_BUDGET]."""
    generator = torch.Generator().manual_seed(seed)

    def ids(length: int) -> list[int]:
        return torch.randint(10, 400, (length,), generator=generator).tolist()

    prompts = [ids(3 + i % 4) for i in range(8)]
    responses = [ids(2 + i % 5 + i // 4) for i in range(8)]
    advantages = torch.randn(8, generator=generator)[:, None].expand(8, RESPONSE_BUDGET).clone()
    return prompts, responses, advantages


def two_updates(engine: TrainerEngine, after_first: Any = None) -> tuple[list[dict[str, float]], Any]:
    """Score the tiny batch, then a PPO-clip update, twice (seeds 1 and 2); the engine is replaced by
    `after_first(engine)` between them. Returns each update's metrics and the last engine."""
    prompts, responses, advantages = tiny_batch()
    metrics = []
    for update in (1, 2):
        if update == 2 and after_first is not None:
            engine = after_first(engine)
        old_logp, _, _ = engine.score(prompts, responses)
        batch = TrainBatch(prompts, responses, old_logp, advantages[:, : old_logp.shape[1]])
        metrics.append(engine.train_step(batch, seed=update))
    return metrics, engine


def _join() -> None:
    from probepo.run import distributed
    from slurm.ranks import job_ranks

    torch.set_num_threads(1)
    job_ranks().export()
    distributed.join()


def two_updates_on_ranks(model_folder: str, zero_stages: list[int], out: str) -> list[dict[str, Any]]:
    """For each ZeRO stage: two updates straight through, and again with a checkpoint after the first that
    a fresh engine resumes from. Rank 0 writes the final weights (`<out>/zero<stage>/final.safetensors`);
    every rank returns, per stage, its metrics and whether the resumed engine's weights and optimizer
    shard equal the straight one's."""
    from probepo.engines.deepspeed_engine import DeepSpeedTrainerEngine
    from probepo.engines.hf import load_policy
    from probepo.run import distributed

    _join()
    results = []
    for zero_stage in zero_stages:
        folder = Path(out) / f"zero{zero_stage}"
        checkpoint = folder / "after-update-1"

        def engine_on(source: str | Path, stage: int = zero_stage) -> DeepSpeedTrainerEngine:
            model, tokenizer = load_policy(source)
            return DeepSpeedTrainerEngine(
                model,
                OPTIM,
                AlgoConfig(),
                zero_stage=stage,
                response_budget=RESPONSE_BUDGET,
                tokenizer=tokenizer,
            )

        def save_and_resume(
            engine: DeepSpeedTrainerEngine, checkpoint: Path = checkpoint
        ) -> DeepSpeedTrainerEngine:
            engine.save(checkpoint)
            resumed = engine_on(checkpoint)
            resumed.load(checkpoint)
            return resumed

        metrics, straight = two_updates(engine_on(model_folder))
        resumed_metrics, resumed = two_updates(engine_on(model_folder), save_and_resume)
        first, again = straight.state().tensors, resumed.state().tensors
        weights = straight.weights()  # under ZeRO-3 gathered collectively
        with straight.live_weights() as live:  # the hand-off's view: gathered for the block, not copied
            same = [torch.equal(tensor.cpu(), weights[name]) for name, tensor in live.items()]
            lent = live.keys() == weights.keys() and all(same)
        fingerprinted = straight.weights_fingerprint() == weights_fingerprint(weights.items())
        if distributed.rank() == 0:
            tensors = {k: v.contiguous() for k, v in weights.items() if k != "lm_head.weight"}  # tied
            save_file(tensors, folder / "final.safetensors")
        results.append(
            {
                "zero_stage": zero_stage,
                "rank": distributed.rank(),
                "world_size": distributed.world_size(),
                "metrics": metrics,
                "resumed_metrics": resumed_metrics,
                "shard_tensors": sum(name.startswith("optim.") for name in first),
                "live_weights_are_the_copy": lent,
                "fingerprint_of_the_copy": fingerprinted,
                "resumed_bitwise": first.keys() == again.keys()
                and all(torch.equal(first[k], again[k]) for k in first),
                "files": sorted(path.name for path in checkpoint.iterdir()),
            }
        )
    distributed.leave()
    return results


def replay_optimize_on_ranks(
    store_url: str, run_id: str, config_json: str, scratch: str, update: int
) -> bool:
    """Optimize of `update` of a committed run, uninterrupted: policy `update` restored from the store (its
    checkpoint, or the last one and a replay of the optimize stages since), then one train step on the
    update's committed batch. Whether the weights and this rank's optimizer shard equal what the run
    committed as checkpoint `update` + 1 (every rank of the job must call it)."""
    from safetensors.torch import load_file

    from probepo.config import RunConfig
    from probepo.run import distributed
    from probepo.run.schedule import Stage, optimizer_shard_name
    from probepo.stages.batch import training_batch
    from probepo.stages.committed import at_update, fetch_policy
    from probepo.stages.context import StageContext
    from probepo.stages.policy import PolicyEngines
    from probepo.store import open_store

    _join()
    config = RunConfig.model_validate_json(config_json)
    ctx = StageContext(open_store(store_url), run_id, update, config, Path(scratch))
    engine = PolicyEngines().trainer(ctx, optimizer_state=True)
    engine.train_step(training_batch(ctx), seed=ctx.seed(Stage.OPTIMIZE))
    committed = fetch_policy(at_update(ctx, update + 1))
    stem = optimizer_shard_name(distributed.rank(), distributed.world_size())
    shard = load_file(committed / f"{stem}.safetensors")
    mine = {k: v for k, v in engine.state().tensors.items() if k.startswith("optim.")}
    weights, saved = engine.weights(), load_file(committed / "model.safetensors")
    same = shard.keys() == mine.keys() and all(torch.equal(shard[k], mine[k]) for k in shard)
    same = same and all(torch.equal(saved[k], weights[k]) for k in saved)
    steps = json.loads((committed / "trainer.json").read_text())["optimizer_steps"]
    distributed.leave()
    return same and steps > 0 and "replay_diverged" not in ctx.attempt_notes


def replay_on_two_local_ranks(
    store_url: str, run_id: str, config_json: str, folder: Path, update: int
) -> list:
    """`replay_optimize_on_ranks` in a local job of two tasks (job files and scratch under `folder`); each
    rank's answer."""
    import submitit

    executor = submitit.LocalExecutor(folder=folder / "replay-jobs")
    executor.update_parameters(tasks_per_node=2, timeout_min=10)
    job = executor.submit(
        replay_optimize_on_ranks, store_url, run_id, config_json, str(folder / "replay"), update
    )
    return job.results()
