"""Where MathTask's problems come from: the benchmark files (probepo.data.benchmarks: the MATH training set
for RL, an evaluation set for the eval split), and short arithmetic word problems generated offline by
the `reasoning-gym` package (Apache-2.0) for CPU demos with a small instruct model.

Each function returns `{"train": [...], "eval": [...]}` for `MathTask(tokenizer, family, problems)`. The
package's licence (Apache-2.0) covers the generated problems; nothing is downloaded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from probepo.data.benchmarks import BenchmarkProblem, load_benchmark
from probepo.data.contamination import math_training_set
from probepo.data.math_task import MathProblem
from probepo.data.task import split_of

DEMO_GENERATOR = "basic_arithmetic"
"""reasoning-gym's generator for the SmolLM2-135M-Instruct demo. Measured on 16 of its problems × 4 samples
(temperature 1, 128 tokens, chat template): the model never boxes an answer by itself with the standard
instruction, but 13 of 64 are right when the cutoff-rescue suffix asks for the box; with `DEMO_INSTRUCTION`
6 of 32 samples box an answer and 1 is right. The word problems tried (leg_counting with 1–2 animals,
gsm_symbolic) scored 1 boxed answer in 64, wrong."""
DEMO_CONFIG: Mapping[str, Any] = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
    "operators": ("+", "-"),
    "allow_parentheses": False,
    "allow_negation": False,
}
"""Two one-digit terms, + or −: e.g. "Calculate 5 - 3." (answer 2)."""
DEMO_INSTRUCTION = "Write your final answer as \\boxed{answer}."
"""The demo's instruction (`MathTask(..., instruction=...)`): the one SmolLM2-135M boxed most often with."""


def from_benchmark(problem: BenchmarkProblem) -> MathProblem:
    """A benchmark row as a MathProblem (its golds, reference solution and id kept)."""
    return MathProblem(
        prompt=problem.problem,
        answer=problem.golds[0],
        solution=problem.solution or "",
        id=problem.id,
        golds=problem.golds,
    )


def benchmark_problems(
    eval_set: str = "math500",
    root: str | os.PathLike[str] | None = None,
    train_sources: Sequence[str] = ("math_test",),
) -> dict[str, list[MathProblem]]:
    """RL on `math_training_set(root, train_sources)` (MATH problems minus everything in the six evaluation
    sets), evaluation on `eval_set` (a probepo.data.benchmarks name), both read from the files under
    `root`."""
    return {
        "train": [from_benchmark(p) for p in math_training_set(root, train_sources)],
        "eval": [from_benchmark(p) for p in load_benchmark(eval_set, root)],
    }


def reasoning_gym_problems(
    generator: str, *, size: int, seed: int, config: Mapping[str, Any] | None = None
) -> dict[str, list[MathProblem]]:
    """Problems 0 … size − 1 of a reasoning-gym generator (deterministic from `seed`), duplicates dropped,
    split by the task's hash partition of the problem text (`probepo.data.task.split_of`), so a problem's
    split never depends on size or seed. The answer is reasoning-gym's; `metadata.answer_cot`, where a
    generator has it (gsm_symbolic), is the solution."""
    import reasoning_gym  # lazily: ~3 s to import

    dataset = reasoning_gym.create_dataset(generator, size=size, seed=seed, **dict(config or {}))
    problems: dict[str, list[MathProblem]] = {"train": [], "eval": []}
    seen: set[str] = set()
    for index in range(size):
        item = dataset[index]
        question = item["question"].strip()
        if question in seen:
            continue
        seen.add(question)
        problems[split_of(question)].append(
            MathProblem(
                prompt=question,
                answer=str(item["answer"]),
                solution=item["metadata"].get("answer_cot", ""),
                id=f"{generator}/{seed}/{index}",
            )
        )
    return problems


def demo_problems(size: int = 2000, seed: int = 0) -> dict[str, list[MathProblem]]:
    """The CPU demo's problems: `DEMO_GENERATOR` with `DEMO_CONFIG`."""
    return reasoning_gym_problems(DEMO_GENERATOR, size=size, seed=seed, config=DEMO_CONFIG)
