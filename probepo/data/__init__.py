"""Verifiable tasks: the Task interface and the CPU testbed's synthetic tasks."""

from probepo.config import TaskConfig
from probepo.data.pointer import PointerTask
from probepo.data.synthetic import CharTokenizer, ModChainTask
from probepo.data.task import Problem, Task, Tokenizer

__all__ = ["CharTokenizer", "ModChainTask", "PointerTask", "Problem", "Task", "Tokenizer", "build_task"]


def build_task(config: TaskConfig) -> Task:
    """The task a config describes."""
    if config.kind == "pointer":
        return PointerTask(letters=config.letters, hops=config.hops, seed=config.seed)
    return ModChainTask(steps=config.steps, modulus=config.modulus, ops=config.ops, seed=config.seed)
