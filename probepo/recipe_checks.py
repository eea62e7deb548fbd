"""What a recipe needs of its task, checked where a recipe is composed (the presets' loader, the CLI's
overrides, the flows' parameter check through `probepo.presets.validate_run_config`): these rules build the
task, its tokenizer or read the benchmark registry, which the configuration models below them never import.
Every problem is named, each on its own line; none hides another."""

from __future__ import annotations

from probepo.config import RunConfig
from probepo.config.run import TESTBED_TASKS


def task_problems(config: RunConfig) -> list[str]:
    """Each way `config` does not fit its task, as a line naming the fields and what to do; [] if none.
    A testbed recipe builds its task (cheap: a tokenizer of a few symbols); a maths recipe's benchmark
    names are checked against the registry, its model's context when the model is loaded."""
    if config.task.kind not in TESTBED_TASKS:
        return _benchmark_problems(config)
    from probepo.data import build_task

    task = build_task(config.task)
    problems = []
    if config.model.vocab_size != task.tokenizer.vocab_size:
        problems.append(
            f"model.vocab_size = {config.model.vocab_size} but the {config.task.kind} task's tokenizer has"
            f" {task.tokenizer.vocab_size} tokens: set model.vocab_size = {task.tokenizer.vocab_size}"
        )
    algo = config.algo
    try:
        suffix = task.tokenizer.encode(algo.rescue_suffix) if algo.rescue_tokens else []
    except ValueError as exc:
        problems.append(
            f"algo.rescue_suffix = {algo.rescue_suffix!r} cannot be tokenized by the {config.task.kind}"
            f" task ({exc}): use the task's own suffix {task.rescue_suffix!r} (or algo.rescue_tokens = 0)"
        )
        return problems
    rescue = len(suffix) + algo.rescue_tokens if suffix else 0
    longest = task.longest_prompt() + config.sampling.max_tokens + rescue
    if longest > config.model.context:
        problems.append(
            f"model.context = {config.model.context} is shorter than the longest prompt +"
            f" sampling.max_tokens + rescue = {longest} tokens: raise model.context or lower"
            " sampling.max_tokens"
        )
    return problems


def _benchmark_problems(config: RunConfig) -> list[str]:
    from probepo.data.benchmarks import BENCHMARKS

    unknown = [name for name in (*config.eval.benchmarks, config.task.eval_set) if name not in BENCHMARKS]
    if not unknown:
        return []
    return [f"eval.benchmarks / task.eval_set name {', '.join(unknown)}: choose from {', '.join(BENCHMARKS)}"]
