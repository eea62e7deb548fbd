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
run this time) and prints its tables (`markdown`: docs/BENCHMARKS.md's, which the site renders from that
file).

    .venv/bin/python bench/orchestration.py --executors inline prefect    # with a Prefect server

`idle_wait`: the `sacct` calls of a driver waiting on a job that stays RUNNING, with the polling of
configs/profiles/h200-node.yaml (poll_s, poll_max_s). A real job sleeps on the cluster; the job runner
re-attaches to it (as `probepo resume` does) and is stopped after `--idle-wait-s`; every poll is one
batched `sacct` call (slurm.accounting.job_states), counted at the backend. The calls in an hour follow
from the schedule's arithmetic (the first wait poll_s, each next POLL_GROWTH times longer, capped at
poll_max_s; counted to 3600 s), checked against the calls measured in the window.

    .venv/bin/python bench/orchestration.py --executors --idle-wait-s 300   # the idle wait alone
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchlib import machine, marked, recorded, table

from probepo.config import ExecutionProfile, RunConfig, StageResources
from probepo.presets import load_profile, load_run_config
from probepo.run.execution import StageRequest, StageRunner, now
from probepo.run.pipeline import ensure_warmup, train
from probepo.run.schedule import TRAINING_STAGES, Stage
from probepo.stages.context import StageContext
from probepo.store import ArtifactStore, JobOutcome, open_store
from slurm import DriverStopped, JobRunner, make_runner
from slurm.accounting import JobInfo, cancel
from slurm.backends import SlurmBackend
from slurm.runner import POLL_GROWTH, Backoff

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


class CountingBackend(SlurmBackend):
    """The SLURM backend, counting its state polls: one batched `sacct` call each."""

    def __init__(self, profile: ExecutionProfile) -> None:
        super().__init__(profile)
        self.sacct_calls = 0

    def states(self, job_ids: Iterable[str], submitted_at: dict[str, float]) -> dict[str, JobInfo]:
        self.sacct_calls += 1
        return super().states(job_ids, submitted_at)


def scheduled_polls(poll_s: float, poll_max_s: float, seconds: float) -> int:
    """Polls of a job whose state stays the same for `seconds` after the first poll saw it (a change), by
    the job runner's Backoff: one at 0 s, then one after each wait."""
    backoff, at, polls = Backoff(poll_s, poll_max_s), 0.0, 1
    at += backoff.after(changed=True)
    while at <= seconds:
        polls += 1
        at += backoff.after(changed=False)
    return polls


def idle_wait(partition: str, seconds: float, folder: Path) -> dict[str, Any]:
    """The job runner waiting `seconds` on a real sleeping job, with the H200 profile's polling."""
    example = load_profile(ROOT / "configs" / "profiles" / "h200-node.yaml")
    profile = ExecutionProfile(
        job_folder=str(folder / "jobs"), poll_s=example.poll_s, poll_max_s=example.poll_max_s
    )
    sbatch = ["sbatch", "--parsable", "-p", partition, "-J", "bench-idle", "-o", "/dev/null", "--wrap"]
    sleeper = subprocess.run(
        [*sbatch, f"sleep {int(seconds) + 120}"], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()
    try:
        # until accounting itself says RUNNING (the queue says so first): the window then sees no change
        while (
            subprocess.run(
                ["sacct", "-n", "-X", "-P", "-o", "State", "-j", sleeper], capture_output=True, text=True
            ).stdout.strip()
            != "RUNNING"
        ):
            time.sleep(1.0)
        store, config = open_store(folder / "store"), RunConfig()
        record = {
            "executor": "slurm",
            "job_id": sleeper,
            "state": "RUNNING",
            "node": None,
            "folder": str(folder / "jobs"),
            "submitted_at": now(),
            "submitted_epoch": time.time(),
            "outcome": JobOutcome.OPEN,
        }
        store.record_job("idle", 0, Stage.SAMPLE, record)  # in flight: the runner re-attaches to it
        deadline = time.monotonic() + seconds
        ctx = StageContext(store, "idle", 0, config, folder, should_stop=lambda: time.monotonic() >= deadline)
        backend = CountingBackend(profile)
        started = time.monotonic()
        with contextlib.suppress(DriverStopped):  # stopped at the window's end, as a driver told to stop
            JobRunner(backend, profile).run(StageRequest.of(ctx, Stage.SAMPLE), ctx)
        waited = time.monotonic() - started
    finally:
        cancel([sleeper])
    per_hour = scheduled_polls(profile.poll_s, profile.poll_max_s, 3600.0)
    return {
        "poll_s": profile.poll_s,
        "poll_max_s": profile.poll_max_s,
        "growth": POLL_GROWTH,
        "window_s": round(waited, 1),
        "sacct_calls_measured": backend.sacct_calls,
        # and the poll at which the runner sees it is told to stop
        "sacct_calls_scheduled": scheduled_polls(profile.poll_s, profile.poll_max_s, waited) + 1,
        "sacct_calls_per_hour": per_hour,
        "sacct_calls_per_hour_fixed_poll_s": round(3600 / profile.poll_s),
        "machine": machine(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executors", nargs="*", default=["inline", "local", "slurm", "prefect"])
    parser.add_argument("--partition", default="low")
    parser.add_argument(
        "--idle-wait-s", type=float, default=300.0, help="The idle wait's window (0: no idle wait)."
    )
    args = parser.parse_args()
    config = load_run_config(ROOT / "configs" / "cpu-demo.yaml", {"num_updates": 2, "eval.every": 100})
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    with tempfile.TemporaryDirectory(prefix="probepo-orchestration-") as folder:
        if args.executors:
            store = open_store(Path(folder) / "store")
            ensure_warmup(config, store)
            # a fixed 0.2 s poll (no back-off), as in every measurement of this table: the overhead of the
            # job itself, not of how soon the driver looks
            profile = ExecutionProfile(
                job_folder=str(Path(folder) / "jobs"),
                poll_s=0.2,
                poll_max_s=0.2,
                defaults=StageResources(partition=args.partition, time_min=15),
            )
            for executor in args.executors:
                runner = prefect_runner() if executor == "prefect" else make_runner(executor, profile)
                timed = TimedRunner(runner)
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
        if args.idle_wait_s > 0:
            results["idle_wait"] = idle_wait(args.partition, args.idle_wait_s, Path(folder) / "idle")
            print(f"idle_wait: {results['idle_wait']}", flush=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(markdown(results))


EXECUTORS = {
    "inline": "inline",
    "local": "local (submitit LocalExecutor)",
    "slurm": "slurm (sbatch, 1 CPU per stage)",
    "prefect": "prefect (inline, each stage a Prefect task run in a flow run)",
}
"""The executors of the table, in its order, and how it names each."""


def executors_table(results: dict[str, Any]) -> str:
    """A job per stage: each executor's overhead per stage and its share of an update."""
    rows = [
        [
            label,
            f"{results[name]['seconds_per_stage']:.3g} s",
            f"{results[name]['seconds_per_stage_max']:.3g} s",
            f"{100 * results[name]['share_of_update']:.0f} %",
        ]
        for name, label in EXECUTORS.items()
        if name in results
    ]
    header = ["executor", "overhead per stage (median)", "max", "share of an update"]
    head = recorded(results, "bench/results/orchestration.json") + f"; {results['recipe']}."
    if "load" in results:
        head += f" Load: {results['load']}."
    return "\n".join([head, "", *table(header, rows)])


def idle_wait_table(wait: dict[str, Any]) -> str:
    """The `sacct` calls of an idle wait: measured in the window, by the schedule's arithmetic, and with
    a fixed poll."""
    window = wait["window_s"]
    backoff = f"back-off {wait['poll_s']:g} s → {wait['poll_max_s']:g} s"
    rows = [
        [f"{backoff} (measured)", wait["sacct_calls_measured"], "—"],
        [
            f"{backoff} (the schedule's arithmetic)",
            wait["sacct_calls_scheduled"],
            f"**{wait['sacct_calls_per_hour']}** in the first hour, then {3600 / wait['poll_max_s']:.0f}",
        ],
        [
            f"fixed `poll_s: {wait['poll_s']}` (before)",
            f"{window / wait['poll_s']:.0f}",
            f"{wait['sacct_calls_per_hour_fixed_poll_s']:,}",
        ],
    ]
    header = ["polling", f"`sacct` calls in the {window:.0f} s window", "per hour of idle wait"]
    head = f"`idle_wait`: {recorded(wait, 'bench/results/orchestration.json')}"
    head += f"; growth ×{wait['growth']:g} per unchanged poll."
    return "\n".join([head, "", *table(header, rows)])


def markdown(results: dict[str, Any]) -> str:
    """docs/BENCHMARKS.md's orchestration tables, rendered from bench/results/orchestration.json when the
    site is built: the executors', then the idle wait's."""
    parts = []
    if any(name in results for name in EXECUTORS):
        parts.append(marked("executors", executors_table(results)))
    if "idle_wait" in results:
        parts.append(marked("idle-wait", idle_wait_table(results["idle_wait"])))
    return "\n\n".join(parts)


if __name__ == "__main__":
    main()
