"""What several stages share: the task, the engines on policy k, and the rollouts of update k."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from probepo.config import ModelConfig, SamplingConfig
from probepo.data import Problem, Task, build_task
from probepo.engines.base import GenerationEngine, SamplingParams, TrainerEngine
from probepo.engines.sampler import TorchGenerationEngine
from probepo.engines.trainer import TorchTrainerEngine
from probepo.models.gpt import GPT
from probepo.stages.context import StageContext
from probepo.store.formats import table_from_parquet, tensors_from_bytes

ROLLOUTS = "rollouts.parquet"
CHECKPOINT = "checkpoint"
"""The stage that holds policy k at update k (the store lays it out under checkpoints/<k>/)."""
FETCHED = ".fetched"
"""Written into a scratch policy folder once every file of its commit is there."""


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
        raise ValueError(
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


def fetch_policy(ctx: StageContext, stage: str = CHECKPOINT) -> Path:
    """Download the policy committed as `stage` of this update (by default checkpoint k, i.e. policy k)
    into scratch, every file of its commit; returns its folder."""
    update = ctx.update
    folder = ctx.scratch / f"policy-{update:06d}-{stage}"
    if not (folder / FETCHED).exists():
        folder.mkdir(parents=True, exist_ok=True)
        for name in ctx.store.read_stage(ctx.run_id, update, stage).marker["files"]:
            ctx.store.download_stage_file(ctx.run_id, update, stage, name, folder / name)
        (folder / FETCHED).touch()
    return folder


def model_dtype(model: ModelConfig) -> torch.dtype:
    """A Hugging Face policy's parameter dtype."""
    return getattr(torch, model.dtype)


def policy_device() -> str:
    """Where a Hugging Face policy runs: the job's first GPU when it has one (one GPU per stage until the
    multi-GPU engines land), else the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def new_trainer(ctx: StageContext, model: Any, tokenizer: Any = None) -> TrainerEngine:
    """A trainer engine on `model` with a fresh optimizer, as the run's config sets it up (the Hugging Face
    engine for `model.kind: hf`, saving `tokenizer` with each checkpoint)."""
    cfg = ctx.config
    settings = {"response_budget": cfg.sampling.max_tokens, "temperature": cfg.sampling.temperature}
    if cfg.model.kind == "hf":
        from probepo.engines.hf import HFTrainerEngine

        return HFTrainerEngine(model, cfg.optim, cfg.algo, tokenizer=tokenizer, **settings)
    return TorchTrainerEngine(model, cfg.optim, cfg.algo, **settings)


def trainer_engine(ctx: StageContext, checkpoint: Path | None = None) -> TrainerEngine:
    """A trainer engine on policy k (or on `checkpoint`), optimizer state included."""
    folder = checkpoint or fetch_policy(ctx)
    if ctx.config.model.kind == "hf":
        from probepo.engines.hf import load_policy

        model = ctx.config.model
        engine = new_trainer(ctx, *load_policy(folder, dtype=model_dtype(model), device=policy_device()))
    else:
        engine = new_trainer(ctx, GPT(ctx.config.model))
    engine.load(folder)
    return engine


def generation_engine(ctx: StageContext) -> GenerationEngine:
    """A generation engine on policy k."""
    rows = ctx.config.sampling.batch_rows
    if ctx.config.model.kind == "hf":
        from probepo.engines.hf import HFGenerationEngine

        dtype = model_dtype(ctx.config.model)
        return HFGenerationEngine(fetch_policy(ctx), dtype=dtype, device=policy_device(), max_batch_rows=rows)
    engine = TorchGenerationEngine(GPT(ctx.config.model), max_batch_rows=rows)
    engine.load_weights(fetch_policy(ctx))
    return engine


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
        table = table_from_parquet(ctx.read("sample")[ROLLOUTS])
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
