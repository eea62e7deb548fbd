"""Probe: K continuations from each selected prefix, graded; prefix values shrunk toward the group mean.

Probe continuations are measurements only: they never enter the training batch. A continuation cut off
at the response length limit gets a cutoff rescue (the task's answer suffix, then a few greedy tokens);
its value then estimates the rescue policy, not the unmodified actor, and the rescued fraction is reported.
Each chunk of prefixes the engine decodes is committed as a shard (a safe point for preemption).
"""

from __future__ import annotations

import torch

from probepo.algo.advantage import group_stats, shrink_values
from probepo.methods import method_for
from probepo.run.schedule import PIVOTS, VALUES, Stage
from probepo.stages.common import read_rollouts, read_tensors, response_budget, sampling_params, task_of
from probepo.stages.context import StageContext
from probepo.stages.policy import generation_engine
from probepo.stages.shards import generate_in_shards, graded_over_ranks
from probepo.store.formats import tensors_to_bytes

STAGE = Stage.PROBE


def run(ctx: StageContext) -> None:
    algo = ctx.config.algo
    rollouts = read_rollouts(ctx)
    pivots = read_tensors(ctx, Stage.SELECT, PIVOTS)["pivot_pos"]
    successes = torch.zeros(pivots.shape, dtype=torch.float64)
    trials = torch.zeros(pivots.shape, dtype=torch.float64)
    rescued = torch.zeros(pivots.shape, dtype=torch.float64)
    rows, slots = (pivots >= 0).nonzero(as_tuple=True)
    generated = 0
    if len(rows):
        task = task_of(ctx)
        params = sampling_params(ctx, task)
        cuts = pivots[rows, slots].tolist()
        prefixes = [
            rollouts.prompts[r] + rollouts.responses[r][:t] for r, t in zip(rows.tolist(), cuts, strict=True)
        ]
        rescue_ids = task.tokenizer.encode(algo.rescue_suffix) if algo.rescue_tokens else []
        rescue_len = len(rescue_ids) + algo.rescue_tokens if algo.rescue_tokens else 0
        # probes share the backbone's response length limit (the rescue, too, inside sampling.context)
        budgets = [
            max(0, response_budget(ctx.config.sampling, len(rollouts.prompts[r]), rescue_len) - t)
            for r, t in zip(rows.tolist(), cuts, strict=True)
        ]
        engine = generation_engine(ctx)
        continuations = generate_in_shards(
            ctx,
            STAGE,
            engine,
            prefixes,
            algo.continuations_per_pivot,
            params,
            ctx.seed(STAGE),
            budgets,
            rescue_ids=rescue_ids,
            rescue_tokens=algo.rescue_tokens,
        )
        texts, owners = [], []
        for row, slot, t, samples in zip(rows.tolist(), slots.tolist(), cuts, continuations, strict=True):
            head = rollouts.responses[row][:t]
            for sample in samples:
                texts.append(task.tokenizer.decode(head + sample.ids))
                owners.append((row, slot))
                rescued[row, slot] += sample.rescued
                generated += len(sample.ids)
            trials[row, slot] = len(samples)
        outcomes = graded_over_ranks(ctx, task, texts, [rollouts.problems[row] for row, _ in owners])
        for (row, slot), outcome in zip(owners, outcomes, strict=True):
            successes[row, slot] += float(outcome == "correct")
    mean, _ = group_stats(rollouts.rewards, rollouts.group)
    kappa = algo.kappa if method_for(algo.algorithm).shrinks_values else 0.0
    values = shrink_values(successes, trials, mean[:, None], kappa=kappa)
    continuations_total = int(trials.sum())
    summary = {
        "continuations": continuations_total,
        "tokens": generated,
        "rescued_fraction": float(rescued.sum()) / continuations_total if continuations_total else 0.0,
        "success_rate": float(successes.sum()) / continuations_total if continuations_total else 0.0,
    }
    tensors = {"values": values, "successes": successes, "trials": trials, "rescued": rescued}
    ctx.commit(STAGE, {VALUES: tensors_to_bytes(tensors)}, summary)
