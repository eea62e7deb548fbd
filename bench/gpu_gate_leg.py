"""One leg of bench/gpu_gate.py: `train` (or resume) one run in this process, with the inline executor, until
it completes or stops at a safe point (a stop that PROBEPO_STOP_AT sends, as SLURM's USR2 would), timing
each stage and its peak memory. A leg is a process of its own so that a resume is a new process, as after a
real preemption, and so that the determinism it sets (probepo.run.determinism) is that leg's alone.

    python bench/gpu_gate_leg.py CONFIG_JSON STORE RUN_ID OUT_JSON [--threads N]

OUT_JSON gets {"outcome": "complete" | "preempted", "seconds", "stages": [{update, stage, seconds,
peak_gib}, ...]}; peak_gib is the GPU's peak allocation during the stage, on the CPU the process's peak
resident memory (reset before each stage where Linux allows).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from probepo.config import RunConfig
from probepo.run.execution import InlineRunner, StageRequest
from probepo.run.pipeline import train
from probepo.run.preemption import Preempted
from probepo.stages.context import StageContext
from probepo.store import open_store

PROC_SELF = Path("/proc/self")


def reset_peak_memory() -> None:
    """Start a new peak: the GPU allocator's, else the process's resident high-water mark (Linux resets it
    when "5" is written to /proc/self/clear_refs)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    elif (PROC_SELF / "clear_refs").exists():
        (PROC_SELF / "clear_refs").write_text("5")


def peak_memory_gib() -> float | None:
    """The peak since `reset_peak_memory`, in GiB; None where it cannot be read."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    status = PROC_SELF / "status"
    if not status.exists():
        return None
    for line in status.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20  # kB
    return None


class MeasuredRunner(InlineRunner):
    """The inline runner, recording each stage's wall seconds and peak memory (the stages it runs: those
    already committed are skipped by the driver, not run)."""

    def __init__(self) -> None:
        super().__init__()
        self.stages: list[dict[str, Any]] = []

    def run(self, request: StageRequest, ctx: StageContext) -> None:
        reset_peak_memory()
        started = time.perf_counter()
        try:
            super().run(request, ctx)
        finally:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.stages.append(
                {
                    "update": request.update,
                    "stage": str(request.stage),
                    "seconds": round(time.perf_counter() - started, 3),
                    "peak_gib": peak_memory_gib(),
                }
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path, help="the run's RunConfig as JSON")
    parser.add_argument("store", help="the store's URL")
    parser.add_argument("run_id")
    parser.add_argument("out", type=Path, help="where this leg's record goes")
    parser.add_argument("--threads", type=int, default=1, help="torch's CPU threads (one per process)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = RunConfig.model_validate_json(args.config.read_text())
    runner = MeasuredRunner()
    started = time.perf_counter()
    try:
        train(config, args.run_id, store=open_store(args.store), runner=runner)
        outcome = "complete"
    except Preempted:
        outcome = "preempted"
    record = {"outcome": outcome, "seconds": round(time.perf_counter() - started, 3), "stages": runner.stages}
    args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
