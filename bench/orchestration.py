"""What it costs to run each stage as a job: per-stage overhead of the inline, local and SLURM executors on
the CPU testbed, and its share of an update.

    .venv/bin/python bench/orchestration.py        # needs the cluster of infra/slurm (SLURM_CONF set)

One run of the embedded default (configs/cpu-demo.yaml, 2 updates, evaluated before and after) per
executor, in one store, from the same shared warm-up. A stage's overhead is the time the driver spent on
it (submit, wait, see the commit) minus the stage's own wall time (its summary's `wall_s`): for a job,
scheduling, a fresh interpreter importing torch, opening the store and reading inputs; for inline, the
attempt records. `share_of_update` = the overhead of an update's six training stages over that update's
wall time. `prefect` is the inline runner with each stage a Prefect task run inside a flow run
(flows/runner.py; needs PREFECT_API_URL, e.g. from infra/prefect/start.sh): its overhead minus inline's is
what the task wrapper costs. Writes bench/results/orchestration.json (merging the entries of executors not
run this time) and prints a markdown table.

    .venv/bin/python bench/orchestration.py --executors inline prefect    # with a Prefect server
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchlib import machine

from probepo.config import ExecutionProfile, RunConfig, StageResources
from probepo.execution import StageRequest, StageRunner
from probepo.pipeline import ensure_warmup, train
from probepo.presets import load_run_config
from probepo.schedule import TRAINING_STAGES
from probepo.stages.context import StageContext
from probepo.store import ArtifactStore, open_store
from slurm import make_runner

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "orchestration.json"


class TimedRunner:
    """A runner that times what the driver spends on each stage it hands to `inner`."""

    def __init__(self, inner: StageRunner) -> None:
        self.inner = inner
        self.seconds: dict[tuple[int, str], float] = {}

    @property
    def resident(self) -> bool:
        return self.inner.resident

    def run(self, request: StageRequest, ctx: StageContext) -> None:
        started = time.perf_counter()
        self.inner.run(request, ctx)
        self.seconds[(request.update, request.stage)] = time.perf_counter() - started


def overheads(store: ArtifactStore, run_id: str, timed: TimedRunner) -> dict[str, float]:
    """Seconds per stage (median over the run's stages) the driver spent beyond the stage's own work, and
    the training stages' overhead as a share of their update's driver time."""
    extra, shares = [], []
    for update in sorted({u for u, _ in timed.seconds}):
        driver = {s: t for (u, s), t in timed.seconds.items() if u == update}
        own = {s: store.marker(run_id, update, s)["summary"]["wall_s"] for s in driver}
        extra += [driver[s] - own[s] for s in driver]
        if all(s in driver for s in TRAINING_STAGES):
            spent = sum(driver[s] for s in TRAINING_STAGES)
            shares.append(sum(driver[s] - own[s] for s in TRAINING_STAGES) / spent)
    return {
        "seconds_per_stage": round(statistics.median(extra), 3),
        "seconds_per_stage_max": round(max(extra), 3),
        "share_of_update": round(statistics.mean(shares), 3),
        "stages_timed": len(extra),
    }


def prefect_runner() -> StageRunner:
    from flows.runner import PrefectStageRunner

    return PrefectStageRunner(make_runner("inline"))


def in_a_flow(config: RunConfig, run_id: str, **kwargs: Any) -> None:
    """`train` inside a Prefect flow run (its task runs need one)."""
    from prefect import flow

    @flow(name="orchestration-bench")
    def bench_flow() -> None:
        train(config, run_id, **kwargs)

    bench_flow()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executors", nargs="*", default=["inline", "local", "slurm", "prefect"])
    parser.add_argument("--partition", default="low")
    args = parser.parse_args()
    config = load_run_config(ROOT / "configs" / "cpu-demo.yaml", {"num_updates": 2, "eval.every": 100})
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    with tempfile.TemporaryDirectory(prefix="probepo-orchestration-") as folder:
        store = open_store(Path(folder) / "store")
        ensure_warmup(config, store)
        profile = ExecutionProfile(
            job_folder=str(Path(folder) / "jobs"),
            poll_s=0.2,
            defaults=StageResources(partition=args.partition, time_min=15),
        )
        for executor in args.executors:
            timed = TimedRunner(prefect_runner() if executor == "prefect" else make_runner(executor, profile))
            drive = in_a_flow if executor == "prefect" else train
            drive(config, f"bench-{executor}", store=store, runner=timed)
            results[executor] = overheads(store, f"bench-{executor}", timed)
            print(f"{executor}: {results[executor]}", flush=True)
    results.update(
        machine=machine(),
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        command="python " + " ".join(sys.argv),
        recipe="configs/cpu-demo.yaml, num_updates = 2, eval.every = 100",
    )
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print("| executor | overhead per stage (median, s) | max (s) | share of an update |\n|---|---|---|---|")
    for executor in ("inline", "local", "slurm", "prefect"):
        if executor in results:
            r = results[executor]
            print(
                f"| {executor} | {r['seconds_per_stage']:.2f} | {r['seconds_per_stage_max']:.2f}"
                f" | {100 * r['share_of_update']:.0f} % |"
            )


if __name__ == "__main__":
    main()
