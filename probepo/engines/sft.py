"""Supervised warm-up: teacher-forced cross-entropy on worked solutions, one step at a time, so the
caller can measure accuracy between steps and stop inside a target window (the transition is sharp)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.nn.functional import cross_entropy

from probepo.data.task import WARMUP_STREAM, Problem, Task
from probepo.engines.base import GenerationEngine, SamplingParams
from probepo.engines.packing import response_logits
from probepo.models.gpt import GPT


@dataclass(frozen=True)
class SftStep:
    """After optimizer step `step` (1-based): the batch's mean token cross-entropy."""

    step: int
    loss: float


def sft_steps(
    model: GPT,
    task: Task,
    *,
    batch_size: int = 64,
    lr: float = 3e-3,
    grad_clip: float = 1.0,
    seed: int = 0,
) -> Iterator[SftStep]:
    """Trains `model` in place on worked solutions of train problems (step k trains on batch k of the
    warm-up stream), yielding after every AdamW step; endless: the caller stops iterating."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    step = 0
    while True:
        problems = task.batch(WARMUP_STREAM, seed, step, batch_size)
        model.train()
        logits, targets, mask = response_logits(
            model, [task.prompt_ids(p) for p in problems], [task.solution_ids(p) for p in problems]
        )
        loss = cross_entropy(logits[mask], targets[mask])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        step += 1
        yield SftStep(step=step, loss=loss.item())


def accuracy(
    engine: GenerationEngine, task: Task, problems: list[Problem], params: SamplingParams, seed: int
) -> float:
    """Fraction of problems answered right by one sample each."""
    samples = engine.generate([task.prompt_ids(p) for p in problems], 1, params, seed)
    rewards = [
        task.verify(task.tokenizer.decode(group[0].ids), problem)
        for group, problem in zip(samples, problems, strict=True)
    ]
    return sum(rewards) / max(len(rewards), 1)
