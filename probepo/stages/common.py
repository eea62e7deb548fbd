"""What several stages share: the task, the names of their files, and the committed inputs of update k
(rollouts, trees, tensors). The training batch: batch.py; the engines on policy k: policy.py."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from probepo.config import SamplingConfig
from probepo.data import Problem, Task, build_task
from probepo.engines.base import SamplingParams
from probepo.presets import ConfigError
from probepo.schedule import Stage
from probepo.stages.context import StageContext
from probepo.store.formats import table_from_parquet, tensors_from_bytes

ROLLOUTS = "rollouts.parquet"
TREE = "tree.parquet"
"""The tree baselines' trees, one row per node (trees.py), committed by sample beside the rollouts."""
SCORES = "scores.safetensors"
PIVOTS = "pivots.safetensors"
"""The select stage's [N, M] `pivot_pos` (-1 = none)."""
VALUES = "values.safetensors"
"""The probe stage's [N, M] prefix `values` and their counts (successes, trials, rescued)."""
ADVANTAGES = "advantages.safetensors"
LOSS_MASK = "loss_mask"
"""The tensor of ADVANTAGES that, where present, marks the tokens in the loss (spo_tree's probability
mask)."""


def task_of(ctx: StageContext) -> Task:
    return build_task(ctx.config.task, ctx.config.model)


def sampling_params(ctx: StageContext, task: Task, *, temperature: float | None = None) -> SamplingParams:
    """The run's sampling settings, stopping at the task's end token."""
    params = SamplingParams.from_config(ctx.config.sampling, [task.tokenizer.eos_id])
    if temperature is not None:
        params = replace(params, temperature=temperature)
    return params


def response_budget(sampling: SamplingConfig, prompt_len: int, rescue_len: int = 0) -> int:
    """Tokens a response to a `prompt_len`-token prompt may have: max_tokens, less what `sampling.context`
    leaves after the prompt and a probe's rescue (`rescue_len` tokens)."""
    if sampling.context is None:
        return sampling.max_tokens
    room = sampling.context - prompt_len - rescue_len
    if room < 1:
        raise ConfigError(
            f"sampling.context = {sampling.context} leaves no room for a response after a {prompt_len}-token"
            f" prompt (and {rescue_len} rescue tokens): raise sampling.context or shorten the prompts"
        )
    return min(sampling.max_tokens, room)


def policy_files(folder: Path) -> dict[str, Path]:
    """A saved policy's files as a commit takes them: every file the engine wrote (a testbed checkpoint's
    weights, config, optimizer state and step counts; a Hugging Face one adds its tokenizer files)."""
    return {
        path.name: path
        for path in sorted(folder.iterdir())
        if path.is_file() and not path.name.startswith(".")
    }


@dataclass(frozen=True)
class GradedProblem(Problem):
    """A problem as the rollouts keep it: with every gold answer a grader accepts (maths problems may have
    several; a testbed problem has its one answer)."""

    golds: tuple[str, ...] = ()


@dataclass
class Rollouts:
    """The backbone responses of one update, as committed by the sample stage (N = P·G rows)."""

    group: Tensor
    """[N] long: the prompt (group) of each response."""
    prompts: list[list[int]]
    responses: list[list[int]]
    rewards: Tensor
    """[N] float64."""
    finished: Tensor
    """[N] bool: the response ended with the stop token (not cut at max_tokens)."""
    problems: list[Problem]
    """The problem each response answers (for grading probe continuations)."""

    @classmethod
    def read(cls, ctx: StageContext) -> Rollouts:
        table = table_from_parquet(ctx.read(Stage.SAMPLE)[ROLLOUTS])
        return cls(
            group=torch.tensor(np.asarray(table["group"]), dtype=torch.long),
            prompts=[list(map(int, p)) for p in table["prompt_ids"]],
            responses=[list(map(int, r)) for r in table["response_ids"]],
            rewards=torch.tensor(np.asarray(table["reward"]), dtype=torch.float64),
            finished=torch.tensor(np.asarray(table["finish_reason"]) == "stop"),
            problems=[
                GradedProblem(prompt, answer, solution, golds=tuple(golds))
                for prompt, answer, solution, golds in zip(
                    table["prompt"],
                    table["answer"],
                    table["solution"],
                    table.get("golds") or [[a] for a in table["answer"]],  # rollouts older than golds
                    strict=True,
                )
            ],
        )

    @cached_property
    def mask(self) -> Tensor:
        """[N, T] bool, T the longest response: response tokens, contiguous from position 0."""
        lengths = torch.tensor([len(r) for r in self.responses])
        width = int(lengths.max()) if len(lengths) else 0
        return torch.arange(width)[None, :] < lengths[:, None]


def read_tensors(ctx: StageContext, stage: str, name: str) -> dict[str, Tensor]:
    """A committed safetensors file of a stage of this update."""
    return tensors_from_bytes(ctx.read(stage)[name])


def read_tree(ctx: StageContext) -> dict[str, Tensor]:
    """The update's trees (tree baselines) as [Nn] long node arrays: group, parent, depth, row (the leaf's
    rollout row, -1 elsewhere) and the node's segment as span [start, end) of rollout row span_row."""
    table = table_from_parquet(ctx.read(Stage.SAMPLE)[TREE])
    return {
        name: torch.tensor(np.asarray(table[name], dtype=np.int64))
        for name in ("group", "parent", "depth", "row", "span_row", "start", "end")
    }


@dataclass(frozen=True)
class TrainingRows:
    """The rows an update trains on: score, advantage and optimize all work on these. Which rows they are is
    the method's (`Method.rows`): one per response, or one per tree edge for spo_tree."""

    prompts: list[list[int]]
    responses: list[list[int]]
