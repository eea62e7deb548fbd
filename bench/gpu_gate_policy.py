"""The GPU gate's starting policy: a Qwen2 model of R1-Distill-Qwen-1.5B's shape (bench/gpu_check.py's; a
tiny one on the CPU) on Qwen's real tokenizer, its weights random except the output rows of the tokens of
one answer, `Let me think.\\nThe answer is \\boxed{d}.`, fitted so that it answers every problem that way
with a guessed digit d.

Why fitted: a random model never writes a boxed answer, so every reward, advantage and gradient of the gate's
run would be 0 and AdamW would leave the weights as they are: the gate would test no bit of the backward
pass or the optimizer. Fitted on the gate's training problems (each has a one-digit gold), the model tells
some of them apart by its random features and guesses the others (on the CPU gate 44-75 % of the samples of
an update are right): rewards vary within groups, and the updates move the weights.

The fit is a logistic regression on the random body's features: the body stays as drawn, so its hidden
states at the answer's positions (teacher-forced after each problem's prompt) are computed once; only the
answer tokens' output rows are trained, against the log-sum-exp of every other token's logit, which stays
fixed: the full softmax's exact cross-entropy at a fraction of its cost.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from probepo.config import RunConfig
from probepo.data import build_task

ANSWER = "Let me think.\nThe answer is \\boxed{{{digit}}}."
"""What the fitted model writes, `digit` a guess (then its EOS)."""
FIT_PROBLEMS = 128
"""Training problems whose prompts the fit sees."""
FIT_STEPS = 200
LOGIT_STEP = 0.4
"""About how far one Adam step moves a logit (the learning rate is this over the root of the hidden size)."""
HEAD_CHUNK = 256
"""Positions whose full-vocabulary logits are computed at a time (bounds the [positions, vocab] table)."""


def build_policy(config: RunConfig, shape: dict[str, Any], device: torch.device, seed: int = 0) -> float:
    """Save the policy into `config.model.pretrained` (a random-init Qwen2 of `shape` in the recipe's dtype,
    with Qwen's tokenizer, its answer rows fitted on the recipe's task); returns the fit's final loss (nats
    per answer token)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tests.hf.tiny_qwen import qwen_tokenizer

    folder = Path(config.model.pretrained or "")
    tokenizer = qwen_tokenizer()
    tokenizer.save_pretrained(folder)  # the task reads its tokenizer from the policy's folder
    eos = tokenizer.eos_token_id
    torch.manual_seed(seed)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, config.model.dtype))
    try:
        with device:
            model = Qwen2ForCausalLM(Qwen2Config(**shape, eos_token_id=eos, pad_token_id=eos)).eval()
    finally:
        torch.set_default_dtype(default_dtype)
    task = build_task(config.task, config.model)
    problems = [task.problem(index, "train") for index in range(min(FIT_PROBLEMS, task.split_size("train")))]
    prompts = [task.prompt_ids(problem) for problem in problems]
    answers = [[*tokenizer.encode(ANSWER.format(digit=problem.answer)), eos] for problem in problems]
    loss = _fit_answer_rows(model, prompts, answers, device)
    model.save_pretrained(folder)
    return loss


def _fit_answer_rows(
    model: Any, prompts: list[list[int]], answers: list[list[int]], device: torch.device
) -> float:
    """Train the output rows of the answers' tokens so that each answer follows its prompt (see the module
    docstring); returns the final cross-entropy."""
    hidden, targets = _answer_features(model, prompts, answers, device)
    head = model.get_output_embeddings().weight
    vocab = torch.tensor(sorted({token for answer in answers for token in answer}), device=device)
    rest = _other_logsumexp(hidden, head.detach().float(), vocab)
    labels = torch.searchsorted(vocab, targets)  # each target's index among the answer tokens
    rows = torch.nn.Parameter(head.detach()[vocab].float().clone())
    optimizer = torch.optim.Adam([rows], lr=LOGIT_STEP / math.sqrt(hidden.shape[1]))
    for _ in range(FIT_STEPS):
        logits = torch.cat([hidden @ rows.T, rest[:, None]], dim=1)  # the other tokens as one logit
        loss = torch.nn.functional.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        head[vocab] = rows.to(head.dtype)
    return loss.item()


@torch.no_grad()
def _answer_features(
    model: Any, prompts: list[list[int]], answers: list[list[int]], device: torch.device
) -> tuple[Tensor, Tensor]:
    """The final hidden states (float32) at every position that predicts an answer token, teacher-forced
    after its prompt, one sequence at a time (no padding), and the tokens they predict."""
    features, targets = [], []
    for prompt, answer in zip(prompts, answers, strict=True):
        ids = torch.tensor([prompt + answer], device=device)
        hidden = model.model(input_ids=ids).last_hidden_state[0]
        features.append(hidden[len(prompt) - 1 : -1].float())
        targets.append(ids[0, len(prompt) :])
    return torch.cat(features), torch.cat(targets)


@torch.no_grad()
def _other_logsumexp(hidden: Tensor, head: Tensor, vocab: Tensor) -> Tensor:
    """[N]: the log-sum-exp of each position's logits over every token but `vocab`'s (the fixed rows),
    HEAD_CHUNK positions at a time."""
    sums = []
    for start in range(0, len(hidden), HEAD_CHUNK):
        logits = hidden[start : start + HEAD_CHUNK] @ head.T
        logits[:, vocab] = -torch.inf
        sums.append(torch.logsumexp(logits, dim=1))
    return torch.cat(sums)
