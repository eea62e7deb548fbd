"""What several stages share: the task, and the committed inputs of update k (rollouts, trees, tensors),
which the method table's rules read through `StageInputs`, each from the folder of the stage that the stage
table says writes it (probepo.run.schedule.STAGES, where the files' names live). The training batch: batch.py;
the engines on policy k: policy.py."""

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
from probepo.methods.inputs import Rollouts
from probepo.presets import ConfigError
from probepo.run.schedule import PIVOTS, ROLLOUTS, SCORES, TREE, VALUES, written_by
from probepo.stages.context import StageContext
from probepo.store.formats import table_from_parquet, tensors_from_bytes


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


def read_rollouts(ctx: StageContext) -> Rollouts:
    """Update k's rollouts as the sample stage committed them."""
    table = table_from_parquet(read_committed(ctx, ROLLOUTS))
    return Rollouts(
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


def read_committed(ctx: StageContext, name: str) -> bytes:
    """A committed file of this update, from the folder of the stage that writes it (schedule.written_by)."""
    return ctx.read(written_by(name))[name]


def read_tensors(ctx: StageContext, stage: str, name: str) -> dict[str, Tensor]:
    """A committed safetensors file of a stage of this update."""
    return tensors_from_bytes(ctx.read(stage)[name])


def read_tree(ctx: StageContext) -> dict[str, Tensor]:
    """The update's trees (tree baselines) as [Nn] long node arrays: group, parent, depth, row (the leaf's
    rollout row, -1 elsewhere) and the node's segment as span [start, end) of rollout row span_row."""
    table = table_from_parquet(read_committed(ctx, TREE))
    return {
        name: torch.tensor(np.asarray(table[name], dtype=np.int64))
        for name in ("group", "parent", "depth", "row", "span_row", "start", "end")
    }


class StageInputs:
    """Update k's inputs as the method table's rules read them (probepo.methods.inputs.UpdateInputs), from
    the store: each committed file is read when a rule first asks for it, so a rule that needs no scores
    (the random selector, GRPO's pivots) reads none."""

    def __init__(self, ctx: StageContext, rollouts: Rollouts | None = None) -> None:
        self._ctx = ctx
        if rollouts is not None:
            self.rollouts = rollouts

    @cached_property
    def rollouts(self) -> Rollouts:
        return read_rollouts(self._ctx)

    @cached_property
    def step_end(self) -> Tensor:
        task = task_of(self._ctx)
        step_end = torch.zeros_like(self.rollouts.mask)
        for row, response in enumerate(self.rollouts.responses):
            step_end[row, : len(response)] = torch.tensor(task.step_end(response), dtype=torch.bool)
        return step_end

    @cached_property
    def scores(self) -> dict[str, Tensor]:
        return tensors_from_bytes(read_committed(self._ctx, SCORES))

    @cached_property
    def pivots(self) -> Tensor:
        return tensors_from_bytes(read_committed(self._ctx, PIVOTS))["pivot_pos"]

    @cached_property
    def values(self) -> Tensor:
        return tensors_from_bytes(read_committed(self._ctx, VALUES))["values"]

    @cached_property
    def tree(self) -> dict[str, Tensor]:
        return read_tree(self._ctx)
