"""Evaluate: Mean@k of policy k on a fixed set of eval-split problems, with its standard error."""

from __future__ import annotations

import math

from probepo.stages.common import generation_engine, sampling_params, task_of
from probepo.stages.context import StageContext
from probepo.store.formats import table_to_parquet

STAGE = "evaluate"
RESULTS = "eval.parquet"


def run(ctx: StageContext) -> None:
    settings = ctx.config.eval
    task = task_of(ctx)
    problems = [task.problem(i, "eval") for i in range(settings.problems)]
    k = 1 if settings.temperature == 0 else settings.samples_per_problem
    params = sampling_params(ctx, task, temperature=settings.temperature)
    # The same seed at every update and in every run: arms are compared on the same random stream.
    samples = generation_engine(ctx).generate(
        [task.prompt_ids(p) for p in problems], k, params, settings.seed
    )
    per_problem = [
        sum(task.verify(task.tokenizer.decode(s.ids), problem) for s in group) / k
        for problem, group in zip(problems, samples, strict=True)
    ]
    n = len(per_problem)
    accuracy = sum(per_problem) / n
    variance = sum((x - accuracy) ** 2 for x in per_problem) / (n - 1) if n > 1 else 0.0
    summary = {
        "accuracy": accuracy,
        "stderr": math.sqrt(variance / n),
        "problems": n,
        "samples_per_problem": k,
    }
    ctx.commit(
        STAGE, {RESULTS: table_to_parquet({"problem": list(range(n)), "correct": per_problem})}, summary
    )
