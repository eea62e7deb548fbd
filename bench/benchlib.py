"""What every benchmark records beside its figures: the machine it ran on."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path


def machine() -> str:
    """CPU model, core count, OS, Python and torch versions (torch only if it is installed) with the
    vector instructions torch's CPU kernels use: results are bitwise only between machines that agree."""
    names = [
        line.split(":", 1)[1].strip()
        for line in Path("/proc/cpuinfo").read_text().splitlines()
        if line.startswith("model name")
    ]
    cpu = names[0] if names else platform.processor() or platform.machine()
    described = f"{cpu}, {os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}"
    try:
        import torch
    except ImportError:
        return described
    return f"{described}, torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()} kernels)"


def seconds_of(run: Callable[[], object]) -> float:
    """The wall seconds of one call of `run`."""
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    """The median of `repeats` timed calls of `run`."""
    return statistics.median(seconds_of(run) for _ in range(repeats))
