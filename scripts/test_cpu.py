"""Where a test run's CPU-seconds went, per test, its SLURM jobs included (issue 61's measurement).

    PROBEPO_RECORD_TEST_CPU=/tmp/cpu.jsonl bash scripts/test  # each test's own CPU: tests/conftest.py
    .venv/bin/python scripts/test_cpu.py /tmp/cpu.jsonl [--top 40] [--json out.json]

The clusters keep their accounting after a stop (until a `start --fresh`): the script starts those not
running, as root, reads them and stops what it started.

A test's CPU is its worker's and the worker's waited-for children's (inline runs, local executor jobs,
`probepo` subprocesses) plus the jobs SLURM ran for it: every job step's TotalCPU (`sacct --duplicates`, so a
requeued job's every run) on the test's cluster, attributed to the test whose span holds the job's submit time
(on the `main` cluster, which tests of no group share with tests/flows, split evenly among the tests running
then). The services' own CPU (slurmctld, moto, Ceph, Prefect) is nobody's: the total of /proc/stat says how
much.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import clusters


def cpu_seconds(text: str) -> float:
    """sacct's TotalCPU ([DD-][HH:]MM:SS[.mmm]) in seconds."""
    days, _, clock = text.rpartition("-")
    parts = [float(part) for part in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    return (int(days) if days else 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def cluster_jobs(name: str, since: float) -> list[dict]:
    """Every run of every job cluster `name` accounted since `since`: its id, name, submit time and the CPU of
    all its steps."""
    env = {**os.environ, **clusters.environment(name)}
    start = datetime.fromtimestamp(since).strftime("%Y-%m-%dT%H:%M:%S")
    fields = "JobIDRaw,JobName,Submit,TotalCPU"
    listed = subprocess.run(
        ["sacct", "-a", "-P", "-n", "--duplicates", "-S", start, "-E", "now", f"--format={fields}"],
        capture_output=True, text=True, timeout=120, env=env, check=True,
    )  # fmt: skip
    jobs: dict[tuple[str, str], dict] = {}
    current: tuple[str, str] | None = None
    for line in listed.stdout.splitlines():
        job_id, job_name, submit, total = line.split("|")
        base = job_id.split(".", 1)[0]
        if "." not in job_id:  # the allocation's line: its name and submit time; its steps' CPU follows
            key = (base, submit)
            jobs[key] = {"job": base, "name": job_name, "submit": datetime.fromisoformat(submit).timestamp(),
                         "cpu_s": 0.0}  # fmt: skip
            current = key
        elif current is not None:
            jobs[current]["cpu_s"] += cpu_seconds(total)
    return list(jobs.values())


def attribute(tests: list[dict], jobs_by_cluster: dict[str, list[dict]]) -> None:
    """Add each job's CPU to the test (or tests) running on its cluster when it was submitted."""
    for test in tests:
        test["jobs"] = 0
        test["jobs_cpu_s"] = 0.0
    for name, jobs in jobs_by_cluster.items():
        candidates = [t for t in tests if (t["cluster"] or "main") == name]
        for job in jobs:
            running = [t for t in candidates if t["start"] <= job["submit"] <= t["end"]]
            for test in running:
                test["jobs"] += 1
                test["jobs_cpu_s"] += job["cpu_s"] / len(running)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", type=Path, help="the PROBEPO_RECORD_TEST_CPU file of the run")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--json", type=Path, help="write every test's figures here")
    args = parser.parse_args()
    tests = [json.loads(line) for line in args.records.read_text().splitlines() if line.strip()]
    since = min(t["start"] for t in tests)
    names = sorted({t["cluster"] or "main" for t in tests})
    try:
        attribute(tests, {name: cluster_jobs(name, since) for name in names})
    finally:
        clusters.stop_started_here()
    for test in tests:
        test["total_cpu_s"] = round(test["cpu_s"] + test["children_cpu_s"] + test["jobs_cpu_s"], 1)
        test["wall_s"] = round(test["end"] - test["start"], 1)
    tests.sort(key=lambda t: -t["total_cpu_s"])
    whole = sum(t["total_cpu_s"] for t in tests)
    print(f"{len(tests)} tests, {whole:.0f} CPU-s, {sum(t['jobs'] for t in tests)} SLURM jobs")
    print("| CPU-s | own | children | jobs (n) | wall s | test |\n|---|---|---|---|---|---|")
    for t in tests[: args.top]:
        print(f"| {t['total_cpu_s']:.0f} | {t['cpu_s']:.0f} | {t['children_cpu_s']:.0f} | "
              f"{t['jobs_cpu_s']:.0f} ({t['jobs']}) | {t['wall_s']:.0f} | {t['test']} |")  # fmt: skip
    by_module: dict[str, float] = defaultdict(float)
    for t in tests:
        by_module[t["test"].split("::", 1)[0]] += t["total_cpu_s"]
    print("\n| CPU-s | module |\n|---|---|")
    for module, seconds in sorted(by_module.items(), key=lambda item: -item[1])[: args.top]:
        print(f"| {seconds:.0f} | {module} |")
    if args.json:
        args.json.write_text(json.dumps(tests, indent=1) + "\n")


if __name__ == "__main__":
    main()
