"""The demo as a benchmark: `probepo demo` from an empty store (warm-up included), timed, with the peak
resident memory of its largest process; records the accuracy gained by each arm.

    .venv/bin/python bench/demo.py            # about 5 minutes on the 2-core CPU machine
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

from benchlib import machine

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


if __name__ == "__main__":
    main()
