"""The data a recipe reads, and the rules that need its tokenizer: every benchmark file present (with its
rows), the training set free of evaluation problems, the rescue suffix tokenizable, and the longest prompt
with its response within the model's context."""

from __future__ import annotations

from typing import TYPE_CHECKING

from probepo.checks.findings import Findings
from probepo.checks.model import ModelFiles, model_context
from probepo.config import RunConfig
from probepo.data import Task, build_task
from probepo.data.benchmarks import (
    AVG6_BENCHMARKS,
    BENCHMARKS,
    BenchmarkFormatError,
    benchmarks_root,
    load_benchmark,
)
from probepo.data.contamination import ContaminationError

if TYPE_CHECKING:
    from probepo.checks.launch import Launch


def check(launch: Launch) -> Findings:
    """The recipe's data, once its model's files are found (a recipe that failed validation waits: the data
    needs the whole recipe, its task and its tokenizer)."""
    model_found, model = launch.model
    config = launch.config
    if config is None or model_found.failures:
        return Findings()
    found = benchmark_findings(config)
    if config.task.kind != "math" or found.failures:
        return found  # the testbed tasks' rules ran when the recipe was validated
    return found.extend(_tokenized_task(config, model, *launch.task))


def benchmark_names(config: RunConfig) -> list[str]:
    """Every benchmark set the recipe reads: its eval split, evaluation sets and training sources, and for
    a MATH training set the six evaluation sets its contamination check compares against."""
    if config.task.kind != "math" or config.task.source != "benchmarks":
        return []
    names = [config.task.eval_set, *config.eval.benchmarks, *config.task.train_sources]
    return list(dict.fromkeys([*names, *AVG6_BENCHMARKS]))


def benchmark_findings(config: RunConfig) -> Findings:
    """Every benchmark file a maths recipe reads present, with its rows."""
    found = Findings()
    if config.task.kind == "math" and config.task.source == "benchmarks":
        root = benchmarks_root(config.task.benchmarks_root)
        for name in benchmark_names(config):
            path = root / BENCHMARKS[name].folder / BENCHMARKS[name].file
            if not path.is_file():
                found.failures.append(
                    f"benchmark {name}: {path} not found: set task.benchmarks_root (or PROBEPO_BENCHMARKS)"
                    " to the folder holding the benchmark sets, on a file system the jobs share"
                )
                continue
            try:
                found.passed.append(f"data: benchmark {name}: {len(load_benchmark(name, root))} rows")
            except BenchmarkFormatError as exc:
                found.failures.append(f"benchmark {name}: {exc}")
    return found


def built_task(config: RunConfig) -> tuple[Findings, Task | None]:
    """The task as a job builds it (its tokenizer, its training problems and their contamination check), or
    None with a failure saying why."""
    try:
        return Findings(), build_task(config.task, config.model)
    except ContaminationError as exc:
        return Findings(failures=[f"task.train_sources: {exc}"]), None
    except (OSError, ValueError) as exc:
        return Findings(failures=[f"task: {str(exc).splitlines()[0]}"]), None


def _tokenized_task(config: RunConfig, model: ModelFiles, built: Findings, task: Task | None) -> Findings:
    """What depends on the task as a job builds it (`built_task`: `built` its failure where `task` is
    None): its rows, the rescue suffix, the longest prompt with its response within the model's context."""
    if task is None:
        return built
    found = Findings()
    rows = {split: len(problems) for split, problems in task.problems.items()}
    found.passed.append(f"data: training and eval problems {rows}, none an evaluation problem")
    suffix = task.tokenizer.encode(config.algo.rescue_suffix) if config.algo.rescue_tokens else []
    longest = task.longest_prompt() + config.sampling.max_tokens + len(suffix) + config.algo.rescue_tokens
    context = model_context(model.folder)
    if context is not None and longest > context:
        found.failures.append(
            f"sampling.max_tokens = {config.sampling.max_tokens}: the longest prompt"
            f" ({task.longest_prompt()} tokens) + max_tokens + rescue = {longest} tokens is past the"
            f" model's context of {context}: lower sampling.max_tokens or algo.rescue_tokens"
        )
    else:
        of = f"of the model's {context}" if context else "(the model's context is checked when it loads)"
        found.passed.append(f"context: longest prompt + response + rescue = {longest} tokens {of}")
    return found
