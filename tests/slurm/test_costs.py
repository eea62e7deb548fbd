"""GPU-hours on the real cluster's fake GPUs: a job asking `--gres=gpu:2` is requeued while it runs (SLURM
keeps its id and writes a second accounting record), and a two-task array asks one GPU a task. Their
costs equal, to the second, the sum over every record `sacct -D` prints of GPUs × ElapsedRaw; plain
`sacct` (the last record) would have missed the first run. Then `probepo jobs` and `probepo report` show
those numbers for a run whose stages they are recorded for, as the SLURM executor records its jobs (a
run of the tiny recipe with a SLURM job per stage takes minutes here), beside a run trained inline, which
reports its wall time only. About 20 s."""

from __future__ import annotations

import time

import pytest
from typer.testing import CliRunner

from probepo.cli import app
from probepo.run.pipeline import train
from probepo.store import ArtifactStore
from slurm.accounting import job_costs, job_states
from slurm.tables import duration
from tests.slurm.conftest import drill_config
from tests.slurm.drill import TIMEOUT_S, slurm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

GPUS = 2
CPUS = 2


def _sbatch(*options: str) -> str:
    return slurm("sbatch", "--parsable", "-p", "low", "-o", "/dev/null", *options).strip()


def _queued(*job_ids: str) -> str:
    return slurm("squeue", "-h", "-o", "%T", "-j", ",".join(job_ids))


@pytest.fixture(scope="module")
def ended(slurm_cluster) -> dict[str, str | float]:
    """The requeued job and the array, both ended, with when they were submitted."""
    submitted = time.time()
    job = _sbatch(f"--gres=gpu:{GPUS}", "-c", str(CPUS), "--requeue", "--wrap", "sleep 5")
    array = _sbatch("--gres=gpu:1", "--array=0-1", "--wrap", "sleep 1")
    deadline = time.monotonic() + TIMEOUT_S
    while "RUNNING" not in _queued(job):
        assert time.monotonic() < deadline, f"job {job} never ran"
        time.sleep(0.2)
    time.sleep(1.5)  # its first record runs for a second or more
    slurm("scontrol", "requeue", job)
    while _queued(job, array).strip():
        assert time.monotonic() < deadline, f"jobs {job}, {array} still queued"
        time.sleep(0.5)
    return {"job": job, "array": array, "submitted": submitted}


def _records(job_id: str) -> list[tuple[str, int]]:
    """(job id, ElapsedRaw) of every record sacct -D prints for the job (or each task of an array)."""
    shown = slurm("sacct", "-D", "-X", "-n", "-P", "-o", "JobID,ElapsedRaw", "-j", job_id)
    return [(line.split("|")[0], int(line.split("|")[1])) for line in shown.splitlines()]


def test_a_requeued_jobs_gpu_hours_count_every_record_of_it(ended):
    job, array = str(ended["job"]), str(ended["array"])
    records = _records(job)
    assert len(records) >= 2, records  # requeued: one record per run, the same id
    cost = job_costs([job])[job]
    assert (cost.gpus, cost.cpus, cost.records) == (GPUS, CPUS, len(records))
    assert cost.gpu_seconds == sum(GPUS * elapsed for _, elapsed in records)
    assert cost.cpu_seconds == sum(CPUS * elapsed for _, elapsed in records)
    assert cost.gpu_hours == cost.gpu_seconds / 3600
    last_only = int(slurm("sacct", "-X", "-n", "-P", "-o", "ElapsedRaw", "-j", job).strip())
    assert cost.gpu_seconds > GPUS * last_only  # what plain sacct shows of it
    assert job_states([job])[job].state == "COMPLETED"  # state polling still reads the last record

    tasks = job_costs([array])
    assert sorted(tasks) == [f"{array}_0", f"{array}_1"]
    for task, elapsed in _records(array):
        assert (tasks[task].gpus, tasks[task].gpu_seconds) == (1, elapsed)


def test_probepo_jobs_and_report_show_the_gpu_hours(ended, warm_store: ArtifactStore, tmp_path):
    job, array = str(ended["job"]), str(ended["array"])
    run, inline = "costs-slurm", "costs-inline"
    for run_id in (run, inline):
        train(drill_config(), run_id, store=warm_store)
    stage_jobs = {(0, "optimize"): job, (0, "sample"): f"{array}_0", (1, "evaluate"): f"{array}_1"}
    for (update, stage), job_id in stage_jobs.items():
        record = {"executor": "slurm", "job_id": job_id, "state": "COMPLETED", "outcome": "committed"}
        warm_store.record_job(run, update, stage, {**record, "submitted_epoch": ended["submitted"]})
    costs = job_costs(stage_jobs.values())
    hours = {stage: costs[job_id].gpu_seconds / 3600 for (_, stage), job_id in stage_jobs.items()}

    listed = CliRunner().invoke(app, ["jobs", run, "--store", warm_store.url])
    assert listed.exit_code == 0, listed.output
    row = next(
        cells for cells in map(str.split, listed.output.splitlines()) if cells[:3] == ["0", "optimize", job]
    )
    cost = costs[job]
    shown = [duration(cost.elapsed_s), str(cost.records), str(GPUS), f"{hours['optimize']:.4f}"]
    assert row[6:11] == [*shown, f"{cost.cpu_seconds / 3600:.4f}"]
    totals = {line.split()[0]: line.split()[1:] for line in listed.output.split("\n\n")[1].splitlines()}
    assert totals["optimize"][0] == f"{hours['optimize']:.4f}"
    assert totals["run"][0] == f"{sum(hours.values()):.4f}"

    report = CliRunner().invoke(
        app, ["report", run, inline, "--store", warm_store.url, "--out", str(tmp_path)]
    )
    assert report.exit_code == 0, report.output
    training = hours["sample"] + hours["optimize"]
    accuracy = {
        m["update"]: m["evaluate/accuracy"] for m in warm_store.read_metrics(run) if "evaluate/accuracy" in m
    }
    by_policy = [
        line.split(" | ") for line in report.output.splitlines() if line.startswith(f"| {run} | probepo | ")
    ]
    assert [cells[2:5] for cells in by_policy[1:]] == [
        ["0", f"{100 * accuracy[0]:.1f}", "0"],  # policy 0 cost no training
        ["1", f"{100 * accuracy[1]:.1f}", f"{training:.4g}"],  # policy 1: update 0's training stages
    ]
    summary = by_policy[0]  # the comparison table's row: training GPU-h, then every job's
    assert summary[-2:] == [f"{training:.4g}", f"{sum(hours.values()):.4g} |"]
    assert f"{inline}: no job of it was accounted for (it ran inline" in report.output
    alone = CliRunner().invoke(app, ["jobs", inline, "--store", warm_store.url])
    assert "has no stage jobs (it ran inline)" in alone.output and "GPU-h" not in alone.output
