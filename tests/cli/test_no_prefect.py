"""The commands that need no Prefect run where it is not installed (no `flows` extra): `probepo check` of the
testbed, its executor taken by default, in a process where neither `prefect` nor `flows` can be imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WITHOUT_PREFECT = """
import sys
sys.modules["prefect"] = None  # `import prefect` raises ModuleNotFoundError, as where it is not installed
sys.modules["flows"] = None
from probepo.cli import main
sys.argv = ["probepo", *sys.argv[1:]]
main()
"""


def test_check_runs_without_prefect_or_flows(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PROBEPO_SITE", "PROBEPO_STORE")}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PREFECT, "check", "configs/cpu-demo.yaml", "--store", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("executor: inline (the testbed runs in this process")
    assert done.stdout.splitlines()[-1] == "ready: 0 failure(s), 0 warning(s)"
