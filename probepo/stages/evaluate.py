"""Evaluate: Mean@k of policy k on a fixed set of eval-split problems, with its standard error; and, when
`eval.greedy`, the greedy accuracy on the same problems."""

from __future__ import annotations

from probepo.config import EvalConfig
from probepo.data import Problem, Task
from probepo.schedule import EVAL_RESULTS, EVALUATE
from probepo.stages.common import generation_engine, sampling_params, task_of
from probepo.stages.context import StageContext
from probepo.stats import mean_and_stderr
from probepo.store.formats import table_to_parquet

STAGE = EVALUATE
RESULTS = EVAL_RESULTS


def _samples_per_problem(settings: EvalConfig, temperature: float) -> int:
    """k of Mean@k: greedy decoding gives one answer per problem."""
    return 1 if temperature == 0 else settings.samples_per_problem


def _per_problem(ctx: StageContext, task: Task, problems: list[Problem], temperature: float) -> list[float]:
    """[problems] fraction of k samples graded right (k = 1 when greedy)."""
    settings = ctx.config.eval
    k = _samples_per_problem(settings, temperature)
    params = sampling_params(ctx, task, temperature=temperature)
    # The same seed at every update and in every run: arms are compared on the same random stream.
    samples = generation_engine(ctx).generate(
        [task.prompt_ids(p) for p in problems], k, params, settings.seed
    )
    return [
        sum(task.verify(task.tokenizer.decode(s.ids), problem) for s in group) / k
        for problem, group in zip(problems, samples, strict=True)
    ]


def run(ctx: StageContext) -> None:
    settings = ctx.config.eval
    task = task_of(ctx)
    problems = [task.problem(i, "eval") for i in range(settings.problems)]
    correct = _per_problem(ctx, task, problems, settings.temperature)
    accuracy, stderr = mean_and_stderr(correct)
    summary = {
        "accuracy": accuracy,
        "stderr": stderr,
        "problems": len(problems),
        "samples_per_problem": _samples_per_problem(settings, settings.temperature),
    }
    table = {"problem": list(range(len(problems))), "correct": correct}
    if settings.greedy and settings.temperature != 0:
        table["greedy_correct"] = _per_problem(ctx, task, problems, 0.0)
        summary["greedy_accuracy"], summary["greedy_stderr"] = mean_and_stderr(table["greedy_correct"])
    ctx.commit(STAGE, {RESULTS: table_to_parquet(table)}, summary)
