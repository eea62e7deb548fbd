"""bench/gpu_gate.py on the CPU (`--device cpu --small`), so that the GPU gate cannot rot between the sessions
that have a GPU: under both settings of `determinism` a run of the tiny Qwen2 shape with DeepSpeed ZeRO-2 is
stopped by USR2 inside update 0's optimize and inside update 1's probe, resumed in a new process each time,
and ends with every committed file bitwise an uninterrupted run's, its replay matching, nothing lost, and
weights that training moved. Its JSON goes to a temporary folder: bench/results/gpu_gate.json is a GPU's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from probepo.data.benchmarks import benchmarks_root

pytest.importorskip(
    "deepspeed", reason="DeepSpeed is not installed: bash scripts/venv.sh cpu,dev,hf,flows,deepspeed"
)
pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(not (benchmarks_root() / "math_test").is_dir(), reason="no ../shared/benchmarks here"),
]

GATE = Path(__file__).resolve().parents[2] / "bench" / "gpu_gate.py"


def test_the_gpu_gate_passes_on_the_cpu(tmp_path):
    out = tmp_path / "gpu_gate.json"
    command = [sys.executable, str(GATE), "--device", "cpu", "--small", "--work", str(tmp_path / "work")]
    gate = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True, timeout=1700)
    assert gate.returncode == 0, gate.stdout[-4000:] + gate.stderr[-4000:]
    record = json.loads(out.read_text())
    assert record["device"] == "cpu" and record["passed"] and all(record["checks"].values())
    for mode in ("bitwise", "fast"):
        result = record["modes"][mode]
        files = result["files"]
        assert files["stages"] > 30 and not files["lost"] and not files["differing"]  # the CPU is bitwise
        legs = result["preempted"]["legs"]
        assert [leg["outcome"] for leg in legs] == ["preempted", "preempted", "complete"]
        assert [leg["resumes_at"] for leg in legs] == [[0, "optimize"], [1, "probe"], None]
        assert result["preempted"]["replays"] == {"checked": 1, "diverged": []}  # optimize 0, for policy 1
        assert result["weights_moved"]
        assert any(0 < update["sample/reward_mean"] < 1 for update in result["uninterrupted"]["signal"])
        stages = {(stage["update"], stage["stage"]) for stage in result["uninterrupted"]["stages"]}
        assert (3, "evaluate") in stages and all(s["peak_gib"] > 0 for s in result["uninterrupted"]["stages"])
    assert record["bitwise_over_fast"] > 0
    assert not (tmp_path / "work" / "bitwise" / "a").exists()  # each run's store goes once summarized
