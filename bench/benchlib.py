"""What every benchmark records beside its figures (the machine it ran on), and what its tables open with
(the command, date and machine of its results file) when the site renders them from that file."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
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


def when(date: str) -> str:
    """A results file's ISO date as the tables give it, to the minute in UTC: 2026-12-03T13:56Z (a day
    alone stays as it is)."""
    if "T" not in date:
        return date
    return datetime.fromisoformat(date).astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


def recorded(entry: dict, results: str) -> str:
    """The line a table of `results` (the results file's path in the repository) opens with: the command
    that wrote `entry`, the date and the machine, as the entry records them (what it lacks is left out)."""
    command = entry.get("command", "").strip()
    what = f"`{command}` → `{results}`" if command else f"`{results}`"
    ran = "; ".join(
        str(entry[key]) if key == "machine" else when(entry[key])
        for key in ("date", "machine")
        if entry.get(key)
    )
    return f"{what} ({ran})" if ran else what


def marked(name: str, text: str) -> str:
    """`text` between the two comments by which a page's `{include}` takes it alone from the results
    file's tables: `:start-after: <!-- table: NAME -->` and `:end-before: <!-- end: NAME -->`."""
    return f"<!-- table: {name} -->\n{text}\n<!-- end: {name} -->"


def table(header: list[str], rows: list[list[object]]) -> list[str]:
    """A markdown table's lines."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows),
    ]
