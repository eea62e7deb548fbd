"""Optimize: PPO-clip on the backbone responses of update k; commits policy k + 1 (weights and optimizer)
as the checkpoint of update k + 1, then its own summary.

After every mini-batch but the last, the trainer state is committed as a sub-stage `optimize.part-NNNN`,
so a run killed inside the optimizer resumes from the next mini-batch and ends bitwise identical. A run
killed after the checkpoint but before the summary commits only the summary on resume.
"""

from __future__ import annotations

from probepo.engines.base import TrainBatch
from probepo.engines.trainer import combine_metrics
from probepo.preemption import Preempted
from probepo.stages.advantage import ADVANTAGES
from probepo.stages.common import (
    CHECKPOINT,
    Rollouts,
    fetch_policy,
    policy_files,
    read_tensors,
    trainer_engine,
)
from probepo.stages.context import StageContext
from probepo.stages.score import SCORES

STAGE = "optimize"


def part_name(minibatch: int) -> str:
    return f"{STAGE}.part-{minibatch:04d}"


def _metrics(part_summary: dict) -> dict[str, float]:
    """A committed part's optimizer metrics (its summary, less the commit's own wall time)."""
    return {key: value for key, value in part_summary.items() if key != "wall_s"}


def run(ctx: StageContext) -> None:
    following = ctx.store.marker(ctx.run_id, ctx.update + 1, CHECKPOINT)
    if following is not None:  # policy k + 1 is committed: only this stage's summary is missing
        ctx.attempt_notes["minibatches_run"] = 0
        ctx.commit(STAGE, {}, _metrics(following["summary"]))
        return
    rollouts = Rollouts.read(ctx)
    batch = TrainBatch(
        prompts=rollouts.prompts,
        responses=rollouts.responses,
        old_logp=read_tensors(ctx, "score", SCORES)["logp"],
        advantages=read_tensors(ctx, "advantage", ADVANTAGES)["advantages"],
    )
    seed = ctx.seed(STAGE)
    done = sorted(
        s for s in ctx.store.committed_stages(ctx.run_id, ctx.update) if s.startswith(f"{STAGE}.part-")
    )
    history = [_metrics(ctx.store.marker(ctx.run_id, ctx.update, s)["summary"]) for s in done]
    start = len(done)
    checkpoint = fetch_policy(ctx, done[-1]) if done else None
    engine = trainer_engine(ctx, checkpoint)
    n_minibatches = len(engine.minibatches(len(batch.responses), seed))
    ctx.attempt_notes["resumed_at_minibatch"] = start

    def commit_part(index: int, metrics: dict[str, float]) -> None:
        history.append(metrics)
        if index == n_minibatches - 1:
            return  # the last mini-batch's state is the stage's own commit
        folder = ctx.scratch / part_name(index)
        engine.save(folder)
        ctx.commit(part_name(index), policy_files(folder), metrics)
        if ctx.should_stop():
            raise Preempted(f"preempted after mini-batch {index} of update {ctx.update}; progress committed")

    ran = engine.train_step(batch, seed=seed, start_minibatch=start, on_minibatch_done=commit_part)
    ctx.attempt_notes["minibatches_run"] = int(ran["minibatches"])
    folder = ctx.scratch / f"policy-{ctx.update + 1:06d}"
    engine.save(folder)
    summary = {**combine_metrics(history), "minibatches": len(history)}
    ctx.commit(CHECKPOINT, policy_files(folder), summary, update=ctx.update + 1)
    ctx.commit(STAGE, {}, summary)
