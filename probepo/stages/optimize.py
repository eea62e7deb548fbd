"""Optimize: PPO-clip on the backbone responses of update k, making policy k + 1.

When policy k + 1 is due in full (`checkpoint_every`, and after the last update), its weights and optimizer
state are committed as the checkpoint of update k + 1, then this stage's summary. Under a resident driver
(`ctx.uploads`) the stage ends once the state is saved on the node: the checkpoint uploads beside the next
updates (uploads.py), and the summary carries the fingerprint of the weights, as between full checkpoints,
until its marker lands; the run's last checkpoint is committed here. A job told to stop
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
from probepo.run.faults import fault_point
from probepo.run.preemption import Preempted
from probepo.run.schedule import Stage, full_checkpoint
from probepo.stages.batch import training_batch
from probepo.stages.committed import fetch_policy, saved_trainer
from probepo.stages.context import StageContext
from probepo.stages.policy import policy_engines
from probepo.stages.replay import FINGERPRINT
from probepo.store.retention import PART_PREFIX, holds, is_part

STAGE = Stage.OPTIMIZE


def part_name(minibatch: int) -> str:
    return f"{PART_PREFIX}{minibatch:04d}"


def part_index(name: str) -> int:
    """The mini-batch a part was committed after (`optimize.part-0002` → 2)."""
    return int(name.removeprefix(PART_PREFIX))


def minibatch_point(minibatch: int) -> str:
    """The fault point's stage name of a mini-batch boundary (`<update>:optimize.minibatch-NNNN:done`)."""
    return f"{STAGE}.minibatch-{minibatch:04d}"


MINIBATCHES = "minibatches_metrics"
"""The key of a part's summary listing the metrics of every mini-batch up to it (a resumed optimize's
summary combines them with its own)."""


def _metrics(summary: dict) -> dict[str, float]:
    """A committed summary's optimizer metrics (less the commit's own wall time and a part's list)."""
    return {key: value for key, value in summary.items() if key not in ("wall_s", MINIBATCHES)}


def _resume_from(parts: dict[str, dict | None]) -> tuple[str | None, int, list[dict[str, float]]]:
    """Where a resumed optimize starts: the latest part holding a trainer state (a part retention pruned, its
    optimize committed and then invalidated, holds none), the mini-batch after it, and the metrics of every
    mini-batch up to it. A part is a stop's, after whichever mini-batch the stop came: it lists them all
    (MINIBATCHES). A part committed before parts were a stop's alone (one after every mini-batch) holds its
    own mini-batch's only, the parts before it theirs."""
    resumable = [name for name, marker in parts.items() if marker is not None and holds(marker) == "full"]
    if not resumable:
        return None, 0, []
    latest = max(resumable, key=part_index)
    summary = parts[latest]["summary"]
    if MINIBATCHES in summary:
        history = [dict(metrics) for metrics in summary[MINIBATCHES]]
    else:
        earlier = sorted(name for name in parts if part_index(name) <= part_index(latest))
        history = [_metrics(parts[name]["summary"]) for name in earlier]
    return latest, part_index(latest) + 1, history


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
    latest, start, history = _resume_from(parts)
    engines = policy_engines(ctx)
    if latest:  # the generator sleeps and any resident trainer goes before the part's trainer loads
        engines.release_trainer(ctx)
        engine = load_trainer(ctx.config, fetch_policy(ctx, latest))
    else:
        engine = engines.trainer(ctx, optimizer_state=True)
        engines.release_trainer(ctx)  # changed in place from here on: resident again once it holds k + 1
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
                ctx.commit(part_name(index), files, {**metrics, MINIBATCHES: list(history)})
        kept = "progress committed" if committing else "nothing committed: the update's optimize reruns"
        raise Preempted(f"preempted after mini-batch {index} of update {ctx.update}; {kept}")

    with spend.timed("optimizer"):  # a stop's part, saved and committed inside, counts as its own
        ran = engine.train_step(batch, seed=seed, start_minibatch=start, on_minibatch_done=after_minibatch)
    ctx.attempt_notes["minibatches_run"] = int(ran["minibatches"])
    summary = {**combine_metrics(history), "minibatches": len(history)}
    folder = ctx.scratch / f"policy-{ctx.update + 1:06d}"
    uploads = ctx.uploads
    if full and uploads is not None:
        uploads.finish(ctx.store)  # one checkpoint at a time in flight and in the node's scratch
    if full and (uploads is None or ctx.update + 1 == cfg.num_updates):  # a stage job's, the run's last
        with saved_trainer(ctx, engine, folder) as files:
            ctx.commit(Stage.CHECKPOINT, files, summary, update=ctx.update + 1)
        ctx.commit(STAGE, {}, summary)
    else:
        if full and uploads is not None:  # uploaded beside the next updates: until it lands, replayed
            with saved_trainer(ctx, engine, folder, handed_on=True) as files:
                uploads.start(ctx, folder, files, summary)
        with spend.timed("digest"):
            fingerprint = engine.weights_fingerprint()
        ctx.commit(STAGE, {}, {**summary, FINGERPRINT: fingerprint})
    engines.trainer_made(ctx, engine, ctx.update + 1)
