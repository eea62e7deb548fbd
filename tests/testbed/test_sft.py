"""Supervised warm-up steps and the accuracy helper."""

import itertools

import torch

from probepo.config import ModelConfig
from probepo.data import ModChainTask
from probepo.engines.base import Completion, SamplingParams
from probepo.engines.sft import accuracy, sft_steps
from probepo.models import GPT

TASK = ModChainTask(steps=2, seed=0)


def test_sft_steps_lower_the_cross_entropy_and_are_deterministic():
    losses = []
    for _ in range(2):
        torch.manual_seed(0)
        model = GPT(ModelConfig(d_model=32, n_heads=4, context=32))
        steps = list(itertools.islice(sft_steps(model, TASK, batch_size=16, lr=3e-3), 30))
        losses.append([s.loss for s in steps])
    assert [s.step for s in steps] == list(range(1, 31))
    assert losses[0] == losses[1]
    assert sum(losses[0][-5:]) / 5 < 0.6 * sum(losses[0][:5]) / 5


class ScriptedEngine:
    """Answers problem i with its worked solution when i is even, a wrong answer otherwise."""

    def generate(self, prompts, n, params, seed):
        problems = {tuple(TASK.prompt_ids(p)): (i, p) for i, p in enumerate(PROBLEMS)}
        out = []
        for prompt in prompts:
            i, problem = problems[tuple(prompt)]
            wrong = f"1+1=2;>{(int(problem.answer) + 1) % 10}"
            ids = TASK.solution_ids(problem) if i % 2 == 0 else [*TASK.tokenizer.encode(wrong), 2]
            out.append([Completion(ids, "stop")] * n)
        return out


PROBLEMS = [TASK.problem(i, "eval") for i in range(10)]


def test_accuracy_counts_verified_samples():
    assert accuracy(ScriptedEngine(), TASK, PROBLEMS, SamplingParams(), seed=0) == 0.5
