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

from probepo.config import RunConfig
from probepo.data import Problem, Task
from probepo.engines.sampler import call_plan, chunk_plan
from probepo.report.stats import mean_and_stderr
from probepo.run.schedule import EVAL_RESULTS, Stage
from probepo.stages.common import response_budget, sampling_params, task_of
from probepo.stages.context import StageContext
from probepo.stages.policy import generation_engine
from probepo.stages.shards import ShardBook, calls_within, generate_in_shards, graded_over_ranks
from probepo.store.formats import table_to_parquet

STAGE = Stage.EVALUATE
RESULTS = EVAL_RESULTS
HELDOUT = "heldout"
"""The suite of a run's own eval split (its `eval` settings); every other suite is a benchmark."""
EVAL_DECODE_TOKENS_PER_S = 3000.0
"""Tokens a second one engine is assumed to decode in an evaluation call whose rows all run to their
response budget: vLLM at 7B (DeepSeekMath-7B) on one H200 at a fixed 0.35 of it (the share before
time-sharing, which only enlarges the cache and the figure), by the H200 roofline of bench/ranks_model.py
(`h200_decoder`, `call_seconds`: a step costs 2 ms + the 13.8 GB of bf16 weights
read at 70 % of 4.8 TB/s, 35 µs a row and each row's KV cache read; the cache, 0.35 × 141 GB less the
weights, holds ~68,000 tokens: ~60 rows of 120 + 1,024), which gives 3,140 tokens/s for a call of 64 such
rows and 4,050-4,310 for calls of 256-2,048: the lower figure, as the roofline is not measured (no GPU
here). A smaller model decodes faster, so its shards end sooner than this says."""
ROW_DECODE_TOKENS_PER_S = 70.0
"""Tokens a second one row decodes in such a call while its batch fills vLLM's cache: the same roofline's
step of ~60 rows at a mean context of ~630 tokens, ~14 ms. (Alone it would decode ~160: bench/results/
ranks.json's sample_longest_row_s, 6.4 s for 1,024 tokens.)"""
EVAL_SHARD_SECONDS = 90.0
"""How long one evaluation shard may take at EVAL_DECODE_TOKENS_PER_S: three quarters of the 120 s
signal_grace_s of configs/profiles/h200-node.yaml's evaluate jobs (the resident driver's is 300 s), the rest
left for its commit and the job's leaving, so that the shard in flight at a stop is committed before the
kill. A constant, not each job's grace: the shards are the evaluation's plan, which a resumed attempt must
find the same under any profile (a kept shard of another plan is refused), and a run may resume on
another partition."""
EVAL_SHARD_TOKENS = int(EVAL_SHARD_SECONDS * EVAL_DECODE_TOKENS_PER_S)
"""The most tokens the rows of one evaluation shard may decode (`calls_within`): 270,000, e.g. 4 chunks of
64 rows of 1,024 tokens. The testbed's evaluations and the tiny recipes' fit in one call: their shards are
the recipe's calls, as before."""


@dataclass(frozen=True)
class Suite:
    """Problems evaluated together, each with k samples; `source` says which, in words."""

    name: str
    problems: list[Problem]
    k: int
    source: str


def _per_problem(
    ctx: StageContext, task: Task, suite: Suite, temperature: float, shards: str, book: ShardBook | None
) -> list[float]:
    """[problems] fraction of each problem's k samples graded right (k = 1 when greedy), the samples made
    over the job's ranks as shards named `shards`, kept in `book` (None: the run's ledger, as the evaluate
    stage keeps them; an evaluation after the fact keeps its own): the same bits either way, and a stopped
    evaluation resumes from them."""
    k = 1 if temperature == 0 else suite.k
    params = sampling_params(ctx, task, temperature=temperature)
    # The same seed at every update and in every run: arms are compared on the same random stream.
    seed = ctx.config.eval.seed
    prompts = [task.prompt_ids(p) for p in suite.problems]
    limits = [response_budget(ctx.config.sampling, len(prompt)) for prompt in prompts]
    engine = generation_engine(ctx)
    samples = generate_in_shards(
        ctx, shards, engine, prompts, k, params, seed, limits, book=book, call_tokens=EVAL_SHARD_TOKENS
    )
    texts = [task.tokenizer.decode(s.ids) for group in samples for s in group]
    problems = [p for p, group in zip(suite.problems, samples, strict=True) for _ in group]
    outcomes = graded_over_ranks(ctx, task, texts, problems)
    rewards = [float(outcome == "correct") for outcome in outcomes]
    return [sum(rewards[i * k : (i + 1) * k]) / k for i in range(len(suite.problems))]


def heldout_suite(ctx: StageContext, task: Task) -> Suite:
    """The run's own eval split: problems 0..problems-1, `samples_per_problem` samples each, each problem
    once: a split of fixed size (a maths task's eval set, math500 by default) gives at most all of its
    problems, never a problem twice."""
    settings = ctx.config.eval
    size = task.split_size("eval")
    count = settings.problems if size is None else min(settings.problems, size)
    return Suite(
        HELDOUT,
        [task.problem(i, "eval") for i in range(count)],
        settings.samples_per_problem,
        f"{_eval_split(ctx.config)}, problems 0-{count - 1}",
    )


def _eval_split(config: RunConfig) -> str:
    """What a run's eval split is, in words."""
    task = config.task
    if task.kind != "math":
        return "the testbed task's eval split"
    if task.source == "benchmarks":
        return f"{task.eval_set} (the task's eval split)"
    return f"the {task.source} problems' eval split"


def benchmark_suite(ctx: StageContext, name: str) -> Suite:
    """A benchmark as a suite: its problems (the first `benchmark_problems`, or all) and k (the study's
    Mean@k, or `benchmark_samples`)."""
    from probepo.data.benchmarks import load_benchmark
    from probepo.data.math_sources import from_benchmark

    problems = [from_benchmark(p) for p in load_benchmark(name, ctx.config.task.benchmarks_root)]
    chosen = problems[: ctx.config.eval.benchmark_problems]
    k = _benchmark_samples(ctx.config, name)
    return Suite(name, chosen, k, f"{name}: {len(chosen)} of its {len(problems)} problems, Mean@{k}")


def _benchmark_samples(config: RunConfig, name: str) -> int:
    """k of a benchmark's Mean@k: the study's, or `eval.benchmark_samples`."""
    from probepo.data.benchmarks import BENCHMARKS

    return config.eval.benchmark_samples or BENCHMARKS[name].mean_at_k or 1


@dataclass(frozen=True)
class ShardBound:
    """The largest shard of a recipe's evaluation, every row at `sampling.max_tokens`: what `probepo check`
    weighs against the grace window of the jobs that evaluate."""

    suite: str
    chunks: int
    rows: int
    tokens: int

    @property
    def seconds(self) -> float:
        """Its decoding at EVAL_DECODE_TOKENS_PER_S."""
        return self.tokens / EVAL_DECODE_TOKENS_PER_S


def largest_shard(config: RunConfig) -> ShardBound:
    """The evaluation's largest shard over its suites (the run's own evaluate stage's, and what an
    evaluation after the fact takes by default), planned as the stage plans them, each row at the most
    tokens it may decode: the stage's own limits (a long prompt's under `sampling.context`) are no more."""
    from probepo.data.benchmarks import BENCHMARKS

    settings, sampling = config.eval, config.sampling
    # (suite, problems, k); a held-out split may hold fewer problems than asked: fewer chunks, no larger ones
    suites = [(HELDOUT, settings.problems, settings.samples_per_problem)]
    if settings.benchmarks:
        suites = [
            (name, min(settings.benchmark_problems or spec.rows, spec.rows), _benchmark_samples(config, name))
            for name, spec in ((name, BENCHMARKS[name]) for name in settings.benchmarks)
        ]
    bounds = []
    for name, problems, samples in suites:
        k = 1 if settings.temperature == 0 else samples
        plan = chunk_plan([0] * problems, k, sampling.batch_rows)
        tokens = [len(chunk) * k * sampling.max_tokens for chunk in plan]
        for call in calls_within(call_plan(len(plan), sampling.shards), tokens, EVAL_SHARD_TOKENS):
            rows = sum(len(plan[c]) for c in call) * k
            bounds.append(ShardBound(name, len(call), rows, sum(tokens[c] for c in call)))
    return max(bounds, key=lambda bound: bound.tokens)


def recipe_suites(config: RunConfig) -> tuple[str, ...]:
    """The suites a run's own evaluate stage scores, and what an evaluation after the fact takes by default:
    its `eval.benchmarks` (a maths run: the study's six at their Mean@k), else its held-out split."""
    return config.eval.benchmarks or (HELDOUT,)


def suites_for(config: RunConfig) -> tuple[str, ...]:
    """The suites a run's checkpoints can be evaluated on: its held-out split, and for a maths run every
    benchmark (a testbed model cannot read them)."""
    from probepo.data.benchmarks import BENCHMARKS

    return (HELDOUT, *BENCHMARKS) if config.task.kind == "math" else (HELDOUT,)


def score_suite(
    ctx: StageContext, task: Task, suite: Suite, book: ShardBook | None = None
) -> tuple[dict[str, float | int], dict[str, list]]:
    """Mean@k of policy k on `suite` at the run's eval temperature: a summary (mean, stderr, problems, k)
    and the per-problem table (id, fraction correct). Its samples are made as shards
    `evaluate.<suite>.shard-CCCC`, kept in `book` (None: the run's ledger)."""
    temperature = ctx.config.eval.temperature
    correct = _per_problem(ctx, task, suite, temperature, f"{STAGE}.{suite.name}", book)
    mean, stderr = mean_and_stderr(correct)
    k = 1 if temperature == 0 else suite.k
    ids = [getattr(p, "id", "") for p in suite.problems]
    return {"mean": mean, "stderr": stderr, "problems": len(suite.problems), "k": k}, {
        "id": ids,
        "correct": correct,
    }


def _heldout(ctx: StageContext, task: Task) -> None:
    settings = ctx.config.eval
    suite = heldout_suite(ctx, task)
    scored, scored_table = score_suite(ctx, task, suite)
    summary = {
        "accuracy": scored["mean"],
        "stderr": scored["stderr"],
        "problems": scored["problems"],
        "samples_per_problem": scored["k"],
    }
    table = {"problem": list(range(len(suite.problems))), "correct": scored_table["correct"]}
    if settings.greedy and settings.temperature != 0:
        table["greedy_correct"] = _per_problem(ctx, task, suite, 0.0, f"{STAGE}.{suite.name}-greedy", None)
        summary["greedy_accuracy"], summary["greedy_stderr"] = mean_and_stderr(table["greedy_correct"])
    ctx.commit(STAGE, {RESULTS: table_to_parquet(table)}, summary)


def benchmark_suites(ctx: StageContext) -> list[Suite]:
    """The run's benchmarks (`eval.benchmarks`) as suites."""
    return [benchmark_suite(ctx, name) for name in ctx.config.eval.benchmarks]


def _benchmarks(ctx: StageContext, task: Task) -> None:
    from probepo.data.benchmarks import AVG6_BENCHMARKS, avg6

    files, summary, means, errors = {}, {}, {}, {}
    for suite in benchmark_suites(ctx):
        scored, table = score_suite(ctx, task, suite)
        means[suite.name], errors[suite.name] = scored["mean"], scored["stderr"]
        files[f"eval-{suite.name}.parquet"] = table_to_parquet(table)
        summary.update({f"{suite.name}/{key}": value for key, value in scored.items()})
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
