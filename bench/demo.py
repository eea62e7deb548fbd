"""The demo as a benchmark: `probepo demo` from an empty store (warm-up included), timed, with the peak
resident memory of its largest process; records the accuracy gained by each arm.

    .venv/bin/python bench/demo.py            # about 5 minutes on the 2-core CPU machine

Writes bench/results/demo.json; `markdown` renders it as docs/BENCHMARKS.md's table (the site renders it from
that file).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from benchlib import machine, recorded, table

from probepo.presets import load_run_config
from probepo.report.summary import load_curves
from probepo.run.demo import arm_runs
from probepo.store import open_store

ROOT = Path(__file__).resolve().parent.parent
PRESET = ROOT / "configs" / "cpu-demo.yaml"


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-demo-") as folder:
        store_dir, out = Path(folder) / "store", Path(folder) / "out"
        command = [sys.executable, "-m", "probepo.cli", "demo", "--store", str(store_dir), "--out", str(out)]
        started = time.perf_counter()
        subprocess.run(command, check=True)
        wall = time.perf_counter() - started
        # ru_maxrss of waited-for descendants: the peak of the largest single process, in KiB on Linux.
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        config = load_run_config(PRESET)
        store = open_store(store_dir)
        gains, curves = {}, {}
        for algorithm, (run_id, _) in arm_runs(config).items():
            c = load_curves(store, run_id)
            gains[algorithm] = round(c.gain_points, 2)
            curves[algorithm] = {
                "eval_updates": c.eval_updates,
                "accuracy": c.accuracy,
                "stderr": c.stderr,
                "sampled_tokens": c.sampled_tokens[-1],
                "wall_s": round(c.wall_s[-1], 1),
            }
    result = {
        "wall_s": round(wall, 1),
        "peak_rss_mb": round(peak_mb, 1),
        "gain_points": gains,
        "targets": {"wall_s": 480, "peak_rss_mb": 1024},
        "arms": curves,
        "machine": machine(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python bench/demo.py",
    }
    path = ROOT / "bench" / "results" / "demo.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(markdown(result))


ARMS = {"grpo": "GRPO", "probepo": "ProbePO"}
"""How the table names each arm."""


def markdown(results: dict) -> str:
    """docs/BENCHMARKS.md's demo table, rendered from bench/results/demo.json when the site is built."""
    arms = results["arms"]
    first = next(iter(arms.values()))
    targets = results["targets"]
    rows = [
        [
            "wall time, set-up excluded, warm-up included",
            f"{results['wall_s']:.0f} s",
            f"≤ {targets['wall_s']} s",
        ],
        [
            "peak resident memory of the largest process",
            f"{results['peak_rss_mb']:.0f} MB",
            f"≤ {targets['peak_rss_mb']:,} MB",
        ],
    ]
    for name, arm in arms.items():
        start, end = arm["eval_updates"][0], arm["eval_updates"][-1]
        errors = ", ".join(f"{100 * arm['stderr'][i]:.1f}" for i in (0, -1))
        rows.append(
            [
                f"{ARMS.get(name, name)} accuracy, update {start} → {end}",
                f"{100 * arm['accuracy'][0]:.1f} % → {100 * arm['accuracy'][-1]:.1f} %"
                f" (**{results['gain_points'][name]:+.1f}** points; standard errors {errors})",
                "learns",
            ]
        )

    def against_first(key: str, unit: str, scale: float, spec: str) -> str:
        figures = ", ".join(f"{ARMS.get(n, n)} {a[key] / scale:{spec}}{unit}" for n, a in arms.items())
        others = [a[key] / first[key] for a in list(arms.values())[1:]]
        return figures + "".join(f" ({ratio:.1f}×)" for ratio in others)

    rows += [
        ["sampled tokens (backbone + probes)", against_first("sampled_tokens", " M", 1e6, ".2f"), "–"],
        [
            f"stage wall time of the {first['eval_updates'][-1]} updates",
            against_first("wall_s", " s", 1, ".0f"),
            "–",
        ],
    ]
    lines = [recorded(results, "bench/results/demo.json"), "", *table(["measure", "value", "target"], rows)]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
