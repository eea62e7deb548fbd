"""Sample: G responses to each of the P prompts of update k from policy k, graded by the task's verifier;
for a method that grows trees (`Method.tree`) a tree per prompt instead (trees.py), its leaves the
responses.

Each chunk of prompts the engine decodes is committed as a shard (a safe point for preemption)."""

from __future__ import annotations

import torch

from probepo.algo.advantage import group_stats
from probepo.data.task import RL_STREAM, golds_of
from probepo.engines.base import Completion, GenerationEngine, SamplingParams
from probepo.methods import method_for
from probepo.methods.trees import Forest, TreeGrower
from probepo.run.schedule import ROLLOUTS, TREE, Stage
from probepo.stages.common import response_budget, sampling_params, task_of
from probepo.stages.context import StageContext
from probepo.stages.policy import generation_engine
from probepo.stages.shards import generate_in_shards, graded_over_ranks
from probepo.store.formats import table_to_parquet

STAGE = Stage.SAMPLE


def _sample_trees(
    ctx: StageContext, grow: TreeGrower, engine: GenerationEngine, params: SamplingParams, forest: Forest
) -> list[list[Completion]]:
    """Grow the run's trees; returns each prompt's leaves as completions (the whole path each)."""

    def sample(name: str, prefixes: list[list[int]], n: int, limits: list[int]) -> list[list[Completion]]:
        return generate_in_shards(
            ctx, f"{STAGE}.{name}", engine, prefixes, n, params, ctx.seed(STAGE, name), limits
        )

    grow(ctx.config.algo, forest, sample, ctx.seed(STAGE, "restarts"))
    groups: list[list[Completion]] = [[] for _ in forest.prompts]
    for leaf in forest.leaves():
        groups[forest.group[leaf]].append(Completion(forest.path(leaf), forest.finish[leaf]))
    return groups


def run(ctx: StageContext) -> None:
    cfg = ctx.config
    task = task_of(ctx)
    problems = task.batch(RL_STREAM, cfg.seed, ctx.update, cfg.prompts_per_update)
    prompts = [task.prompt_ids(p) for p in problems]
    engine, params = generation_engine(ctx), sampling_params(ctx, task)
    limits = [response_budget(cfg.sampling, len(prompt)) for prompt in prompts]
    files: dict[str, bytes] = {}
    grow = method_for(cfg.algo.algorithm).tree
    if grow is not None:
        forest = Forest(prompts, limits)
        groups = _sample_trees(ctx, grow, engine, params, forest)
        files[TREE] = table_to_parquet(forest.table())
        # a shared prefix is sampled once: the tokens sampled are the segments', not the leaves' paths
        tree_summary = {"tree_nodes": len(forest.parent), "tokens": sum(map(len, forest.segment))}
    else:
        groups = generate_in_shards(
            ctx, STAGE, engine, prompts, cfg.group_size, params, ctx.seed(STAGE), limits
        )
        tree_summary = {}
    flat = [
        (index, problem, prompt, c)
        for index, (problem, prompt, samples) in enumerate(zip(problems, prompts, groups, strict=True))
        for c in samples
    ]
    texts = [task.tokenizer.decode(c.ids) for _, _, _, c in flat]
    outcomes = graded_over_ranks(ctx, task, texts, [problem for _, problem, _, _ in flat])
    rows: dict[str, list] = {
        "group": [index for index, _, _, _ in flat],
        "prompt_ids": [prompt for _, _, prompt, _ in flat],
        "response_ids": [c.ids for _, _, _, c in flat],
        "finish_reason": [c.finish_reason for _, _, _, c in flat],
        "reward": [float(outcome == "correct") for outcome in outcomes],
        "outcome": outcomes,
        "prompt": [problem.prompt for _, problem, _, _ in flat],
        "answer": [problem.answer for _, problem, _, _ in flat],
        "golds": [list(golds_of(problem)) for _, problem, _, _ in flat],
        "solution": [problem.solution for _, problem, _, _ in flat],
        "text": texts,
    }
    rewards, lengths = rows["reward"], [len(r) for r in rows["response_ids"]]
    _, group_std = group_stats(torch.tensor(rewards, dtype=torch.float64), torch.tensor(rows["group"]))
    summary = {
        "reward_mean": sum(rewards) / len(rewards),
        "finished_fraction": rows["finish_reason"].count("stop") / len(rewards),
        "response_len_mean": sum(lengths) / len(lengths),
        "tokens": sum(lengths),
        # All-equal rewards: no GRPO signal. Counted per response (a tree's leaves count as its group).
        "uniform_group_fraction": float((group_std == 0).double().mean()),
        **tree_summary,
        # Why the zeros are zeros (a maths task: no_answer, unparsable, wrong, timeout).
        **{f"{o}_fraction": outcomes.count(o) / len(outcomes) for o in sorted(set(outcomes) - {"correct"})},
    }
    ctx.commit(STAGE, {ROLLOUTS: table_to_parquet(rows), **files}, summary)
