"""One update of RL, top to bottom, in memory: read this first.

`reference_update` runs update k of a run the way the committed pipeline does, with no store, no jobs and
no checkpoint files: the same method rules (probepo.methods), the same maths (probepo.algo) and the same
engine calls, with the same seeds, in the order the driver runs its stages (probepo.run.schedule:
TRAINING_STAGES). Each step names the stage module that does the same in the pipeline, where it is
committed, sharded over ranks, preempted and resumed; here each step's output is simply kept for the next.
tests/pipeline/test_reference_update.py holds its advantages, training rows and new weights bitwise equal
to what the pipeline commits, for every method of the table.

Left out, as they change no bit of the update: the stages' summaries and diagnostics, the probe's rescued
counts, the engine calls' split into shards over ranks (a chunk's samples are its own, wherever decoded:
probepo.engines.base.GenerationEngine.continue_from), evaluation, and saving or replaying policies.

Shapes: P prompts, G responses each, N rollout rows (N = P·G; for a tree method one per leaf), T the
longest response, R training rows (N, or one per tree edge for spo_tree), M pivot slots per response.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from probepo.algo.advantage import group_stats, shrink_values
from probepo.config import RunConfig
from probepo.data import Problem, Task, build_task
from probepo.data.task import RL_STREAM
from probepo.engines.base import Completion, GenerationEngine, SamplingParams, TrainBatch, TrainerEngine
from probepo.methods import method_for
from probepo.methods.advantages import LOSS_MASK
from probepo.methods.inputs import Rollouts
from probepo.methods.trees import Forest
from probepo.run.schedule import Stage
from probepo.stages.common import response_budget
from probepo.stages.context import derive_seed

TREE_COLUMNS = ("group", "parent", "depth", "row", "span_row", "start", "end")
"""The node arrays of a forest's table that the rules read (`UpdateInputs.tree`)."""


@dataclass(frozen=True)
class UpdateResult:
    """What one update made, step by step (the files the pipeline's stages commit, in memory)."""

    rollouts: Rollouts
    """sample: N responses with their groups, rewards [N] float64 and finished flags [N] bool."""
    tree: dict[str, Tensor] | None
    """sample (tree methods): [Nn] long node arrays of TREE_COLUMNS; None for G independent responses."""
    scores: dict[str, Tensor]
    """score: `logp`, `entropy` [R, T] float and `mask` [R, T] bool over the training rows."""
    pivots: Tensor
    """select: [N, M] long pivot positions, -1 = none (M = 0 for a method that does not probe)."""
    values: Tensor
    """probe: [N, M] float64 prefix values at the pivots."""
    advantages: dict[str, Tensor]
    """advantage: `advantages` [R, T] float32 and, for spo_tree, LOSS_MASK [R, T] bool."""
    batch: TrainBatch
    """The rows optimize trains on: R' ≤ R rows (spo_tree drops rows its loss mask empties)."""
    metrics: dict[str, float]
    """optimize: the PPO step's metrics, averaged over its mini-batches."""


class _InMemoryInputs:
    """Update k as the method rules read it (probepo.methods.inputs.UpdateInputs): each step sets what it
    made, as each stage commits it (the pipeline's StageInputs reads the same from the store)."""

    rollouts: Rollouts
    step_end: Tensor
    tree: dict[str, Tensor]
    scores: dict[str, Tensor]
    pivots: Tensor
    values: Tensor


def reference_update(
    config: RunConfig, update: int, trainer: TrainerEngine, generator: GenerationEngine
) -> UpdateResult:
    """Update `update` of a run with `config`: `trainer` holds policy k with its optimizer state and is
    left holding policy k + 1; `generator` is given policy k's weights first.

    0. Policy k reaches the generator (stages/policy.py: generation_engine, from the resident trainer).
    1. Sample (stages/sample.py): P prompts of batch k, G responses each from policy k, at most the
       response budget each; a tree method (`Method.tree`) grows a tree per prompt instead, its leaves the
       responses. The task's verifier grades each: reward r ∈ {0, 1} → rollouts [N].
    2. Score (stages/score.py): one forward pass of policy k over the method's training rows
       (`Method.rows`: the responses, or spo_tree's edges): old log-probs and full-vocabulary entropies,
       logits divided by the temperature → [R, T].
    3. Select (stages/select.py): where the method probes (`Method.pivots`), reward-free: ProbePO's
       entropy-ranked step boundaries under the budget, VinePPO's every boundary, none otherwise → [N, M].
    4. Probe (stages/probe.py): K continuations from each pivot's prefix (prompt + response[:t]), a cut-off
       one rescued, graded; V̂ = (k + κ·r̄)/(K + κ) (κ = 0 without shrinkage) → [N, M]. Measurements only:
       no continuation enters the training batch.
    5. Advantage (stages/advantage.py): the method's rule (`Method.advantage`) → token advantages [R, T]
       (spo_tree also its loss mask).
    6. Training rows (stages/batch.py: training_batch): the rows, their old log-probs and advantages;
       rows whose loss mask is empty are dropped → TrainBatch of R' rows.
    7. Optimize (stages/optimize.py): PPO-clip over the shuffled mini-batches, one AdamW step each.
    """
    algo, method = config.algo, method_for(config.algo.algorithm)
    task = build_task(config.task, config.model)
    params = SamplingParams.from_config(config.sampling, [task.tokenizer.eos_id])
    inputs = _InMemoryInputs()

    def seed(stage: Stage, *extra: object) -> int:
        """The stage's seed, as StageContext.seed derives it: the same bits as the pipeline's draws."""
        return derive_seed(config.seed, update, stage, *extra)

    # 0. policy k into the generator
    with trainer.live_weights() as weights:
        generator.load_weights(weights)

    # 1. sample: G responses per prompt (or a tree per prompt), graded
    problems = task.batch(RL_STREAM, config.seed, update, config.prompts_per_update)
    prompts = [task.prompt_ids(problem) for problem in problems]
    limits = [response_budget(config.sampling, len(prompt)) for prompt in prompts]
    tree = None
    groups: list[list[Completion]]  # each prompt's responses
    if method.tree is None:
        groups = generator.continue_from(prompts, config.group_size, params, seed(Stage.SAMPLE), limits)
    else:
        forest = Forest(prompts, limits)

        def sample(name: str, prefixes: list[list[int]], n: int, caps: list[int]) -> list[list[Completion]]:
            return generator.continue_from(prefixes, n, params, seed(Stage.SAMPLE, name), caps)

        method.tree(algo, forest, sample, seed(Stage.SAMPLE, "restarts"))
        groups = [[] for _ in prompts]
        for leaf in forest.leaves():  # the rollout rows: each leaf's whole path, by prompt
            groups[forest.group[leaf]].append(Completion(forest.path(leaf), forest.finish[leaf]))
        table = forest.table()
        tree = inputs.tree = {name: torch.tensor(table[name], dtype=torch.long) for name in TREE_COLUMNS}
    flat = [(group, completion) for group, samples in enumerate(groups) for completion in samples]
    rewards = _rewards(task, [completion.ids for _, completion in flat], [problems[g] for g, _ in flat])
    rollouts = inputs.rollouts = Rollouts(
        group=torch.tensor([group for group, _ in flat], dtype=torch.long),
        prompts=[prompts[group] for group, _ in flat],
        responses=[completion.ids for _, completion in flat],
        rewards=torch.tensor(rewards, dtype=torch.float64),
        finished=torch.tensor([completion.finish_reason == "stop" for _, completion in flat]),
        problems=[problems[group] for group, _ in flat],
    )
    inputs.step_end = torch.zeros_like(rollouts.mask)  # [N, T]: the task's step-end tokens
    for row, response in enumerate(rollouts.responses):
        inputs.step_end[row, : len(response)] = torch.tensor(task.step_end(response), dtype=torch.bool)

    # 2. score: old log-probs and entropies of policy k over the training rows
    rows = method.rows(inputs)
    logp, entropy, mask = trainer.score(rows.prompts, rows.responses)
    inputs.scores = {"logp": logp, "entropy": entropy, "mask": mask}

    # 3. select: pivot positions, reward-free
    pivots = inputs.pivots = method.pivots(algo, inputs, seed(Stage.SELECT))

    # 4. probe: K continuations per pivot, graded; prefix values (measurements, never training data)
    successes = torch.zeros(pivots.shape, dtype=torch.float64)
    trials = torch.zeros(pivots.shape, dtype=torch.float64)
    probes = [(row, slot, int(pivots[row, slot])) for row, slot in (pivots >= 0).nonzero().tolist()]
    if probes:
        heads = [rollouts.responses[row][:t] for row, _, t in probes]  # response tokens before the pivot
        rescue_ids = task.tokenizer.encode(algo.rescue_suffix) if algo.rescue_tokens else []
        rescue_len = len(rescue_ids) + algo.rescue_tokens if algo.rescue_tokens else 0
        budgets = [  # a probe shares its response's length limit, the rescue inside sampling.context
            max(0, response_budget(config.sampling, len(rollouts.prompts[row]), rescue_len) - t)
            for row, _, t in probes
        ]
        continuations = generator.continue_from(
            [rollouts.prompts[row] + head for (row, _, _), head in zip(probes, heads, strict=True)],
            algo.continuations_per_pivot,
            params,
            seed(Stage.PROBE),
            budgets,
            rescue_ids=rescue_ids,
            rescue_tokens=algo.rescue_tokens,
        )
        answers = [head + c.ids for head, samples in zip(heads, continuations, strict=True) for c in samples]
        owners = [
            (row, slot)
            for (row, slot, _), samples in zip(probes, continuations, strict=True)
            for _ in samples
        ]
        graded = _rewards(task, answers, [rollouts.problems[row] for row, _ in owners])
        for (row, slot), reward in zip(owners, graded, strict=True):
            successes[row, slot] += reward
            trials[row, slot] += 1
    group_mean, _ = group_stats(rollouts.rewards, rollouts.group)
    kappa = algo.kappa if method.shrinks_values else 0.0
    inputs.values = shrink_values(successes, trials, group_mean[:, None], kappa=kappa)

    # 5. advantage: the method's token advantages over the training rows
    advantages, _ = method.advantage(algo, inputs)  # (the stage also commits the rule's diagnostics)

    # 6. training rows: what optimize trains on (old log-probs from step 2, advantages from step 5)
    loss_mask = advantages.get(LOSS_MASK)
    keep = torch.arange(len(rows.responses)) if loss_mask is None else loss_mask.any(dim=1).nonzero()[:, 0]
    batch = TrainBatch(
        prompts=[rows.prompts[i] for i in keep.tolist()],
        responses=[rows.responses[i] for i in keep.tolist()],
        old_logp=logp[keep],
        advantages=advantages["advantages"][keep],
        loss_mask=None if loss_mask is None else loss_mask[keep],
    )

    # 7. optimize: PPO-clip on the backbone rows, policy k → policy k + 1
    metrics = trainer.train_step(batch, seed=seed(Stage.OPTIMIZE))
    return UpdateResult(rollouts, tree, inputs.scores, pivots, inputs.values, advantages, batch, metrics)


def _rewards(task: Task, responses: list[list[int]], problems: list[Problem]) -> list[float]:
    """Each response's reward (1.0 where the task's verifier says correct), graded all at once as the
    stages grade (stages/shards.py: graded_over_ranks, on one rank)."""
    texts = [task.tokenizer.decode(ids) for ids in responses]
    return [float(outcome == "correct") for outcome in task.grade_many(texts, problems)]
