"""What several stages share: the task, the engines on policy k, and the rollouts of update k."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from probepo.data import Problem, Task, build_task
from probepo.engines.base import SamplingParams
from probepo.engines.sampler import TorchGenerationEngine
from probepo.engines.trainer import TorchTrainerEngine
from probepo.models.gpt import GPT
from probepo.stages.context import StageContext
from probepo.store.formats import table_from_parquet, tensors_from_bytes

ROLLOUTS = "rollouts.parquet"
CHECKPOINT = "checkpoint"
"""The stage that holds policy k at update k (the store lays it out under checkpoints/<k>/)."""
POLICY_FILES = ("model.safetensors", "config.json", "optimizer.safetensors", "trainer.json")
"""A policy checkpoint as the trainer engine saves it: weights, model config, optimizer state, step counts."""


def task_of(ctx: StageContext) -> Task:
    return build_task(ctx.config.task)


def sampling_params(ctx: StageContext, task: Task, *, temperature: float | None = None) -> SamplingParams:
    """The run's sampling settings, stopping at the task's end token."""
    params = SamplingParams.from_config(ctx.config.sampling, [task.tokenizer.eos_id])
    if temperature is not None:
        params = replace(params, temperature=temperature)
    return params


def fetch_policy(ctx: StageContext, stage: str = CHECKPOINT) -> Path:
    """Download the policy committed as `stage` of this update (by default checkpoint k, i.e. policy k)
    into scratch; returns its folder."""
    update = ctx.update
    folder = ctx.scratch / f"policy-{update:06d}-{stage}"
    if not (folder / POLICY_FILES[-1]).exists():
        folder.mkdir(parents=True, exist_ok=True)
        for name in POLICY_FILES:
            ctx.store.download_stage_file(ctx.run_id, update, stage, name, folder / name)
    return folder


def new_trainer(ctx: StageContext, model: GPT) -> TorchTrainerEngine:
    """A trainer engine on `model` with a fresh optimizer, as the run's config sets it up."""
    cfg = ctx.config
    return TorchTrainerEngine(
        model,
        cfg.optim,
        cfg.algo,
        response_budget=cfg.sampling.max_tokens,
        temperature=cfg.sampling.temperature,
    )


def trainer_engine(ctx: StageContext, checkpoint: Path | None = None) -> TorchTrainerEngine:
    """A trainer engine on policy k (or on `checkpoint`), optimizer state included."""
    engine = new_trainer(ctx, GPT(ctx.config.model))
    engine.load(checkpoint or fetch_policy(ctx))
    return engine


def generation_engine(ctx: StageContext) -> TorchGenerationEngine:
    """A generation engine on policy k."""
    engine = TorchGenerationEngine(GPT(ctx.config.model), max_batch_rows=ctx.config.sampling.batch_rows)
    engine.load_weights(fetch_policy(ctx))
    return engine


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
        table = table_from_parquet(ctx.read("sample")[ROLLOUTS])
        return cls(
            group=torch.tensor(np.asarray(table["group"]), dtype=torch.long),
            prompts=[list(map(int, p)) for p in table["prompt_ids"]],
            responses=[list(map(int, r)) for r in table["response_ids"]],
            rewards=torch.tensor(np.asarray(table["reward"]), dtype=torch.float64),
            finished=torch.tensor(np.asarray(table["finish_reason"]) == "stop"),
            problems=[
                Problem(*fields)
                for fields in zip(table["prompt"], table["answer"], table["solution"], strict=True)
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
