"""Optimize: PPO-clip on the backbone responses of update k, making policy k + 1.

When policy k + 1 is due in full (`checkpoint_every`, and after the last update), its weights and optimizer
state are committed as the checkpoint of update k + 1, then this stage's summary. A job told to stop
(preemption, its time limit: the grace window is for this) stops at the next mini-batch boundary; in such
an update it first commits the trainer state as a sub-stage `optimize.part-NNNN`, so the run resumes from
the next mini-batch and ends bitwise identical. Nothing else is saved mid-optimizer: a hard death (a node
lost, a kill past the grace window) reruns the update's optimize from the last committed state, as it
does any other stage. A run killed after the checkpoint but before the summary commits only the summary on
resume.

Otherwise only the summary is committed, with the fingerprint of the new weights; policy k + 1 stays in the
resident trainer, and a resumed run rebuilds it by replay (policy.py). A stop inside such an update
commits nothing: its optimize reruns whole (it is cheap next to the generation it does not repeat).
"""

from __future__ import annotations

from probepo import spend
from probepo.engines.build import load_trainer
from probepo.engines.trainer import combine_metrics
from probepo.faults import fault_point
from probepo.preemption import Preempted
from probepo.schedule import Stage, full_checkpoint
from probepo.stages.batch import training_batch
from probepo.stages.committed import fetch_policy, saved_trainer
from probepo.stages.context import StageContext
from probepo.stages.policy import keep_trainer, trainer_engine
from probepo.stages.replay import FINGERPRINT
from probepo.store.retention import PART_PREFIX, holds, is_part

STAGE = Stage.OPTIMIZE


def part_name(minibatch: int) -> str:
    return f"{PART_PREFIX}{minibatch:04d}"


def minibatch_point(minibatch: int) -> str:
    """The fault point's stage name of a mini-batch boundary (`<update>:optimize.minibatch-NNNN:done`)."""
    return f"{STAGE}.minibatch-{minibatch:04d}"


def _metrics(part_summary: dict) -> dict[str, float]:
    """A committed part's optimizer metrics (its summary, less the commit's own wall time)."""
    return {key: value for key, value in part_summary.items() if key != "wall_s"}


def run(ctx: StageContext) -> None:
    following = ctx.store.marker(ctx.run_id, ctx.update + 1, Stage.CHECKPOINT)
    if following is not None:  # policy k + 1 is committed: only this stage's summary is missing
        ctx.attempt_notes["minibatches_run"] = 0
        ctx.commit(STAGE, {}, _metrics(following["summary"]))
        return
    cfg = ctx.config
    full = full_checkpoint(ctx.update + 1, num_updates=cfg.num_updates, every=cfg.checkpoint_every)
    batch = training_batch(ctx)
    seed = ctx.seed(STAGE)
    parts = {
        s: ctx.store.marker(ctx.run_id, ctx.update, s)
        for s in ctx.store.committed_stages(ctx.run_id, ctx.update)
        if is_part(s)
    }
    # a part retention pruned (its optimize had committed, then was invalidated) holds nothing to resume from
    done = sorted(s for s, marker in parts.items() if marker is not None and holds(marker) == "full")
    history = [_metrics(parts[s]["summary"]) for s in done]
    start = len(done)
    engine = load_trainer(ctx.config, fetch_policy(ctx, done[-1])) if done else trainer_engine(ctx)
    keep_trainer(ctx, None, -1)  # changed in place from here on: resident again once it holds policy k + 1
    n_minibatches = len(engine.minibatches(len(batch.responses), seed))
    ctx.attempt_notes["resumed_at_minibatch"] = start

    def after_minibatch(index: int, metrics: dict[str, float]) -> None:
        history.append(metrics)
        fault_point(ctx.update, minibatch_point(index), "done", ctx.should_stop)
        if index == n_minibatches - 1 or not ctx.should_stop():
            return  # the last mini-batch's state is the stage's own commit
        committing = full and part_name(index) not in parts  # a pruned part's record stays: none replaces it
        if committing:
            with saved_trainer(ctx, engine, ctx.scratch / part_name(index)) as files:
                ctx.commit(part_name(index), files, metrics)
        kept = "progress committed" if committing else "nothing committed: the update's optimize reruns"
        raise Preempted(f"preempted after mini-batch {index} of update {ctx.update}; {kept}")

    with spend.timed("optimizer"):  # a stop's part, saved and committed inside, counts as its own
        ran = engine.train_step(batch, seed=seed, start_minibatch=start, on_minibatch_done=after_minibatch)
    ctx.attempt_notes["minibatches_run"] = int(ran["minibatches"])
    summary = {**combine_metrics(history), "minibatches": len(history)}
    if full:
        with saved_trainer(ctx, engine, ctx.scratch / f"policy-{ctx.update + 1:06d}") as files:
            ctx.commit(Stage.CHECKPOINT, files, summary, update=ctx.update + 1)
        ctx.commit(STAGE, {}, summary)
    else:
        with spend.timed("digest"):
            fingerprint = engine.weights_fingerprint()
        ctx.commit(STAGE, {}, {**summary, FINGERPRINT: fingerprint})
    keep_trainer(ctx, engine, ctx.update + 1)
