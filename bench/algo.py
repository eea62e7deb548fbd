"""Per-update CPU maths of ProbePO at the headline size, on one torch thread.

P = 64 prompts × G = 8 responses × T = 4,096 positions (lengths uniform in [T/2, T]), 5 pivots per group:
window_max of token entropies → step candidates (a random step end about every 30 tokens) → select_pivots
→ shrink_values (random successes out of K = 8) → grpo_advantages → redistribute.

Time: median wall time over --reps runs after --warmup runs (time.perf_counter), whole update and each
function alone; for the whole update also the minimum wall time, the median user and system CPU time and
minor page faults (getrusage of the thread, means) and the load average: a busy shared machine inflates wall
time. The system time is the kernel zeroing fresh pages for large tensors that glibc returned to it, so
the whole update is timed again with glibc told to keep freed memory (`*_heap_reuse`).
Memory: the peak resident-set growth of one update in a fresh subprocess, with its inputs already built:
the kernel's high-water mark (VmHWM) is reset through /proc/self/clear_refs just before the update and
read after it, minus the resident set before it.

Usage: .venv/bin/python bench/algo.py [--reps 30]
Writes bench/results/algo.json and prints it, then its table (`markdown`: docs/BENCHMARKS.md's, which the
site renders from that file).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
from benchlib import machine, recorded, table

from probepo.algo.advantage import group_stats, grpo_advantages, redistribute, shrink_values
from probepo.algo.pivots import select_pivots, step_candidates, window_max

RESULTS = Path(__file__).parent / "results" / "algo.json"
PROMPTS, GROUP, POSITIONS, PIVOTS, CONTINUATIONS = 64, 8, 4096, 5, 8
WINDOW, MARGIN, SPACING, KAPPA = 8, 8, 16, 4.0
TARGET_MS = 50


def make_inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    n = PROMPTS * GROUP
    lengths = torch.randint(POSITIONS // 2, POSITIONS + 1, (n,), generator=gen)
    return {
        "entropy": torch.rand(n, POSITIONS, generator=gen) * 3,
        "mask": torch.arange(POSITIONS) < lengths[:, None],
        "step_end": torch.rand(n, POSITIONS, generator=gen) < 1 / 30,
        "group": torch.arange(PROMPTS).repeat_interleave(GROUP),
        "rewards": (torch.rand(n, generator=gen) < 0.5).float(),
        "successes": torch.randint(0, CONTINUATIONS + 1, (n, PIVOTS), generator=gen),
    }


def update_steps(x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Everything the CPU computes for one update, from entropies and rewards to token advantages,
    with every intermediate result."""
    out = {"score": window_max(x["entropy"], x["mask"], window=WINDOW)}
    out["candidates"] = step_candidates(x["step_end"], x["mask"], margin=MARGIN)
    out["pivot_pos"] = select_pivots(
        out["score"], out["candidates"], x["group"], max_pivots=PIVOTS, min_spacing=SPACING
    )
    out["baseline"], _ = group_stats(x["rewards"], x["group"])
    out["pivot_val"] = shrink_values(x["successes"], CONTINUATIONS, out["baseline"][:, None], kappa=KAPPA)
    out["seq_adv"] = grpo_advantages(x["rewards"].view(PROMPTS, GROUP)).view(-1)
    out["advantages"] = redistribute(
        out["seq_adv"], x["rewards"], out["baseline"], x["mask"], out["pivot_pos"], out["pivot_val"]
    )
    return out


def update_maths(x: dict[str, torch.Tensor]) -> torch.Tensor:
    """The token advantages of one update (what the benchmark times)."""
    return update_steps(x)["advantages"]


def timings_ms(fn, *, warmup: int, reps: int) -> dict[str, float]:
    """Wall time (median, min); this thread's user and system CPU time and minor page faults (means: the
    system time comes in clock ticks, and faults in bursts)."""
    for _ in range(warmup):
        fn()
    runs = []
    for _ in range(reps):
        before, start = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
        fn()
        wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_THREAD)
        runs.append(
            (
                wall,
                after.ru_utime - before.ru_utime,
                after.ru_stime - before.ru_stime,
                after.ru_minflt - before.ru_minflt,
            )
        )
    wall, user, system, faults = zip(*runs, strict=True)
    return {
        "median": round(1000 * statistics.median(wall), 2),
        "min": round(1000 * min(wall), 2),
        "user_mean": round(1000 * statistics.mean(user), 2),
        "sys_mean": round(1000 * statistics.mean(system), 2),
        "page_faults_mean": round(statistics.mean(faults)),
    }


def reuse_freed_memory() -> None:
    """glibc: serve allocations up to 32 MiB from the heap and never trim it, so that freed pages are reused
    instead of being returned to the kernel and faulted in (zeroed) again by the next large tensor."""
    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 32 << 20)
    libc.mallopt(m_trim_threshold, 1 << 30)


def breakdown_ms(x: dict[str, torch.Tensor], *, warmup: int, reps: int) -> dict[str, float]:
    """Each function alone, on the outputs of the previous ones."""
    steps = update_steps(x)
    score, candidates, pivot_pos = steps["score"], steps["candidates"], steps["pivot_pos"]
    baseline, pivot_val, seq_adv = steps["baseline"], steps["pivot_val"], steps["seq_adv"]
    calls = {
        "window_max": lambda: window_max(x["entropy"], x["mask"], window=WINDOW),
        "step_candidates": lambda: step_candidates(x["step_end"], x["mask"], margin=MARGIN),
        "select_pivots": lambda: select_pivots(
            score, candidates, x["group"], max_pivots=PIVOTS, min_spacing=SPACING
        ),
        "group_stats": lambda: group_stats(x["rewards"], x["group"]),
        "shrink_values": lambda: shrink_values(x["successes"], CONTINUATIONS, baseline[:, None], kappa=KAPPA),
        "grpo_advantages": lambda: grpo_advantages(x["rewards"].view(PROMPTS, GROUP)),
        "redistribute": lambda: redistribute(
            seq_adv, x["rewards"], baseline, x["mask"], pivot_pos, pivot_val
        ),
    }
    return {name: timings_ms(fn, warmup=warmup, reps=reps)["median"] for name, fn in calls.items()}


def _status_kib(field: str) -> int:
    return int(re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M).group(1))


def measure_peak_mb() -> None:
    """(In the fresh subprocess.) Print the resident-set growth of one update over its built inputs."""
    torch.set_num_threads(1)
    x = make_inputs()
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set
    update_maths(x)
    print(json.dumps({"peak_mem_mb": round((_status_kib("VmHWM") - before) / 1024, 1)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--measure-peak", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_peak:
        measure_peak_mb()
        return

    torch.set_num_threads(1)
    load_average = os.getloadavg()[0]
    x = make_inputs()
    total = timings_ms(lambda: update_maths(x), warmup=args.warmup, reps=args.reps)
    parts = breakdown_ms(x, warmup=args.warmup, reps=args.reps)
    reuse_freed_memory()  # last: it changes this process for good
    reused = timings_ms(lambda: update_maths(x), warmup=args.warmup, reps=args.reps)
    probe = subprocess.run(
        [sys.executable, __file__, "--measure-peak"], check=True, capture_output=True, text=True
    )
    peak = json.loads(probe.stdout)["peak_mem_mb"]
    results = {
        "update_maths_ms": total["median"],
        "update_maths_min_ms": total["min"],
        "update_maths_user_ms_mean": total["user_mean"],
        "update_maths_sys_ms_mean": total["sys_mean"],
        "page_faults_per_update_mean": total["page_faults_mean"],
        "update_maths_ms_heap_reuse": reused["median"],
        "update_maths_sys_ms_mean_heap_reuse": reused["sys_mean"],
        "peak_mem_mb": peak,
        "target_ms": TARGET_MS,
        "breakdown_ms": parts,
        "shape": {"prompts": PROMPTS, "group": GROUP, "positions": POSITIONS, "pivots_per_group": PIVOTS},
        "timing": f"median of {args.reps} runs after {args.warmup} warm-up runs, 1 torch thread;"
        " *_heap_reuse: the same after mallopt(M_MMAP_THRESHOLD=32 MiB, M_TRIM_THRESHOLD=1 GiB)",
        "memory": "VmHWM growth over VmRSS in a fresh subprocess, HWM reset via /proc/self/clear_refs",
        "machine": machine(),
        "load_average_1min": round(load_average, 2),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python bench/algo.py",
        "torch": torch.__version__,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    print(markdown(results))


PARTS = (
    (("window_max",), "`window_max` (max_pool1d over an -inf-padded copy)"),
    (("step_candidates",), "`step_candidates`"),
    (("select_pivots",), "`select_pivots` (greedy on the [N, C] candidate lists, C ≪ T)"),
    (
        ("group_stats", "shrink_values", "grpo_advantages"),
        "`group_stats` + `shrink_values` + `grpo_advantages`",
    ),
    (("redistribute",), "`redistribute` (per-segment values expanded by one `repeat_interleave`)"),
)
"""The breakdown's rows: the functions each sums, and how the table names them."""


def markdown(results: dict) -> str:
    """docs/BENCHMARKS.md's algo table, rendered from bench/results/algo.json when the site is built."""
    parts = dict(results["breakdown_ms"])
    named = [(label, sum(parts.pop(name) for name in names)) for names, label in PARTS if names[0] in parts]
    named += [(f"`{name}`", ms) for name, ms in parts.items()]
    rows = [
        [
            "whole update: window_max → step_candidates → select_pivots → shrink_values → grpo_advantages"
            " → redistribute",
            f"**{results['update_maths_ms']:.1f} ms** median (target ≤ {results['target_ms']:g}),"
            f" {results['update_maths_min_ms']:.1f} ms min",
        ],
        [
            "of which CPU time of the thread (means)",
            f"{results['update_maths_user_ms_mean']:.1f} ms user,"
            f" {results['update_maths_sys_ms_mean']:.1f} ms system"
            f" ({results['page_faults_per_update_mean']:,} minor page faults)",
        ],
        [
            "same, glibc keeping freed memory (`mallopt` M_MMAP_THRESHOLD 32 MiB, M_TRIM_THRESHOLD 1 GiB)",
            f"{results['update_maths_ms_heap_reuse']:.1f} ms median,"
            f" {results['update_maths_sys_ms_mean_heap_reuse']:.1f} ms system",
        ],
        [
            "peak memory of one update (resident-set high-water growth over its inputs, fresh process)",
            f"{results['peak_mem_mb']:.1f} MB",
        ],
        *([label, f"{ms:.1f} ms"] for label, ms in named),
    ]
    head = recorded(results, "bench/results/algo.json")
    if "load_average_1min" in results:
        head += f"; 1-min load average {results['load_average_1min']:g} at the start"
    lines = [head + f"; {results['timing'].split(';')[0]}.", "", *table(["measure", "value"], rows)]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
