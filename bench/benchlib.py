"""What every benchmark records beside its figures: the machine it ran on."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path


def _cpu_model() -> str:
    names = [
        line.split(":", 1)[1].strip()
        for line in Path("/proc/cpuinfo").read_text().splitlines()
        if line.startswith("model name")
    ]
    return names[0] if names else platform.processor() or platform.machine()


def machine() -> str:
    """CPU model, core count, OS, Python and torch versions (torch only if it is installed) with the
    vector instructions torch's CPU kernels use: results are bitwise only between machines that agree."""
    python = f"Python {platform.python_version()}"
    described = f"{_cpu_model()}, {os.cpu_count()} cores, {platform.platform()}, {python}"
    try:
        import torch
    except ImportError:
        return described
    return f"{described}, torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()} kernels)"


def cpu_kind() -> str:
    """What decides a CPU run's bits beside the code: the CPU model and the vector instructions torch's
    kernels use (docs/PIPELINE.md, "Bits across machines"). Machines that agree on it train alike."""
    import torch

    return f"{_cpu_model()} ({torch.backends.cpu.get_cpu_capability()} kernels)"


def seconds_of(run: Callable[[], object]) -> float:
    """The wall seconds of one call of `run`."""
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    """The median of `repeats` timed calls of `run`."""
    return statistics.median(seconds_of(run) for _ in range(repeats))
