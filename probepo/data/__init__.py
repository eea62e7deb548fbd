"""Verifiable tasks: the Task interface, the CPU testbed's synthetic tasks, and maths for real models."""

from __future__ import annotations

from functools import lru_cache

from probepo.config import ModelConfig, TaskConfig
from probepo.data.pointer import PointerTask
from probepo.data.synthetic import CharTokenizer, ModChainTask
from probepo.data.task import Problem, Task, Tokenizer

__all__ = ["CharTokenizer", "ModChainTask", "PointerTask", "Problem", "Task", "Tokenizer", "build_task"]


def build_task(config: TaskConfig, model: ModelConfig | None = None) -> Task:
    """The task a config describes; a maths task also needs the model, whose tokenizer it prompts with."""
    if config.kind == "math":
        if model is None or model.kind != "hf" or not model.pretrained:
            raise ValueError("task.kind = math needs a Hugging Face model (model.kind: hf, model.pretrained)")
        return _math_task(config.model_dump_json(), model.pretrained)
    if config.kind == "pointer":
        return PointerTask(letters=config.letters, hops=config.hops, seed=config.seed)
    return ModChainTask(steps=config.steps, modulus=config.modulus, ops=config.ops, seed=config.seed)


@lru_cache(maxsize=4)
def _math_task(task_json: str, pretrained: str) -> Task:
    """Built once per process: loading a tokenizer and the benchmark files takes seconds."""
    from probepo.data.math_sources import benchmark_problems, demo_problems
    from probepo.data.math_task import MathTask
    from probepo.engines.hf.loading import load_tokenizer

    config = TaskConfig.model_validate_json(task_json)
    if config.source == "benchmarks":
        problems = benchmark_problems(config.eval_set, config.benchmarks_root, config.train_sources)
    else:
        problems = demo_problems(config.arithmetic_problems, config.seed)
    return MathTask(
        load_tokenizer(pretrained), config.family, problems, seed=config.seed, instruction=config.instruction
    )
