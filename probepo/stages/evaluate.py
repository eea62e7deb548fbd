"""Evaluate: Mean@k of policy k with its standard error over problems.

- The testbed (and a maths run without `eval.benchmarks`): the task's eval split, problems 0..problems-1,
  `samples_per_problem` samples each, in `eval.parquet`; with `eval.greedy`, also greedy accuracy on the
  same problems.
- A maths run with `eval.benchmarks`: every listed benchmark with the study's Mean@k (16; AIME24 32, unless
  `eval.benchmark_samples`), per-problem results in `eval-<benchmark>.parquet`, and Avg-6 (the unweighted
  mean of the six study sets) when all six are there. Terminal checkpoints are fixed by update count: the
  last update is always evaluated, never a checkpoint chosen per benchmark.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from probepo.data import Problem, Task
from probepo.schedule import EVAL_RESULTS, EVALUATE
from probepo.stages.common import generation_engine, response_budget, sampling_params, task_of
from probepo.stages.context import StageContext
from probepo.stats import mean_and_stderr
from probepo.store.formats import table_to_parquet

STAGE = EVALUATE
RESULTS = EVAL_RESULTS


@dataclass(frozen=True)
class Suite:
    """Problems evaluated together, each with k samples."""

    name: str
    problems: list[Problem]
    k: int


def _per_problem(ctx: StageContext, task: Task, suite: Suite, temperature: float) -> list[float]:
    """[problems] fraction of each problem's k samples graded right (k = 1 when greedy)."""
    k = 1 if temperature == 0 else suite.k
    params = sampling_params(ctx, task, temperature=temperature)
    # The same seed at every update and in every run: arms are compared on the same random stream.
    prompts = [task.prompt_ids(p) for p in suite.problems]
    limits = [response_budget(ctx.config.sampling, len(prompt)) for prompt in prompts]
    samples = generation_engine(ctx).continue_from(prompts, k, params, ctx.config.eval.seed, limits)
    texts = [task.tokenizer.decode(s.ids) for group in samples for s in group]
    rewards = task.verify_many(
        texts, [p for p, group in zip(suite.problems, samples, strict=True) for _ in group]
    )
    return [sum(rewards[i * k : (i + 1) * k]) / k for i in range(len(suite.problems))]


def _heldout(ctx: StageContext, task: Task) -> None:
    settings = ctx.config.eval
    suite = Suite(
        "heldout", [task.problem(i, "eval") for i in range(settings.problems)], settings.samples_per_problem
    )
    correct = _per_problem(ctx, task, suite, settings.temperature)
    accuracy, stderr = mean_and_stderr(correct)
    summary = {
        "accuracy": accuracy,
        "stderr": stderr,
        "problems": len(suite.problems),
        "samples_per_problem": 1 if settings.temperature == 0 else suite.k,
    }
    table = {"problem": list(range(len(suite.problems))), "correct": correct}
    if settings.greedy and settings.temperature != 0:
        table["greedy_correct"] = _per_problem(ctx, task, suite, 0.0)
        summary["greedy_accuracy"], summary["greedy_stderr"] = mean_and_stderr(table["greedy_correct"])
    ctx.commit(STAGE, {RESULTS: table_to_parquet(table)}, summary)


def benchmark_suites(ctx: StageContext) -> list[Suite]:
    """The run's benchmarks as suites: their problems (the first `benchmark_problems` of each, or all) and
    k (the study's Mean@k, or `benchmark_samples`)."""
    from probepo.data.benchmarks import BENCHMARKS, load_benchmark
    from probepo.data.math_sources import from_benchmark

    settings, root = ctx.config.eval, ctx.config.task.benchmarks_root
    suites = []
    for name in settings.benchmarks:
        problems = [from_benchmark(p) for p in load_benchmark(name, root)][: settings.benchmark_problems]
        suites.append(Suite(name, problems, settings.benchmark_samples or BENCHMARKS[name].mean_at_k or 1))
    return suites


def _benchmarks(ctx: StageContext, task: Task) -> None:
    from probepo.data.benchmarks import AVG6_BENCHMARKS, avg6

    files, summary, means, errors = {}, {}, {}, {}
    for suite in benchmark_suites(ctx):
        correct = _per_problem(ctx, task, suite, ctx.config.eval.temperature)
        means[suite.name], errors[suite.name] = mean_and_stderr(correct)
        files[f"eval-{suite.name}.parquet"] = table_to_parquet(
            {"id": [getattr(p, "id", "") for p in suite.problems], "correct": correct}
        )
        summary.update(
            {
                f"{suite.name}/mean": means[suite.name],
                f"{suite.name}/stderr": errors[suite.name],
                f"{suite.name}/problems": len(suite.problems),
                f"{suite.name}/k": suite.k,
            }
        )
    if set(AVG6_BENCHMARKS) <= set(means):
        summary["avg6"] = avg6(means)
        summary["avg6_stderr"] = math.sqrt(sum(errors[name] ** 2 for name in AVG6_BENCHMARKS)) / len(
            AVG6_BENCHMARKS
        )
    # The curve of a run (reports, the UI): Avg-6 where there is one, else the benchmarks' mean.
    summary["accuracy"] = summary.get("avg6", sum(means.values()) / len(means))
    summary["stderr"] = summary.get(
        "avg6_stderr", math.sqrt(sum(e**2 for e in errors.values())) / len(errors)
    )
    ctx.commit(STAGE, files, summary)


def run(ctx: StageContext) -> None:
    task = task_of(ctx)
    if ctx.config.eval.benchmarks:
        _benchmarks(ctx, task)
    else:
        _heldout(ctx, task)
