"""`probepo logs` and the `log` column of `probepo jobs`, through the real command line, on a one-update run
of the tiny recipe whose stages ran as local jobs (submitit subprocesses writing the log files SLURM jobs
write: ~30 s): the last job's files under headers naming them, one stage's job with --tail, and one error
line for a run that ran inline and for a stage without jobs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from probepo.config import ExecutionProfile
from probepo.run.pipeline import train
from probepo.store import ArtifactStore
from tests.pipeline.conftest import tiny_config

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RUN = "logs-local"


def one_update():
    return tiny_config("grpo", num_updates=1, eval={**tiny_config().eval.model_dump(), "every": 10})


def probepo(*args: str) -> subprocess.CompletedProcess[str]:
    """`probepo ARGS` in a fresh process (text)."""
    return subprocess.run(
        [sys.executable, "-m", "probepo.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "PROBEPO_STORE"},
        cwd=ROOT,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and not result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def local_run(warm_store: ArtifactStore, tmp_path_factory: pytest.TempPathFactory) -> str:
    """RUN trained through the command line with --executor local (one job per stage)."""
    folder = tmp_path_factory.mktemp("logs")
    preset, profile = folder / "tiny.yaml", folder / "profile.yaml"
    preset.write_text(yaml.safe_dump(one_update().model_dump(mode="json")))
    job_folder = str(folder / "jobs")
    profile.write_text(
        yaml.safe_dump(
            ExecutionProfile(job_folder=job_folder, poll_s=0.1, poll_max_s=0.1).model_dump(mode="json")
        )
    )
    result = probepo(
        "train", str(preset), "--run-id", RUN, "--store", warm_store.url, "--quiet",
        "--tensorboard", str(folder / "tb"), "--executor", "local", "--profile", str(profile),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return RUN


def test_jobs_shows_each_jobs_stdout_path_last(local_run: str, warm_store: ArtifactStore):
    result = probepo("jobs", local_run, "--store", warm_store.url)
    assert result.returncode == 0, result.stderr
    listing, costs = result.stdout.strip().split("\n\n")
    header, *rows = listing.splitlines()
    assert header.split()[-1] == "log"
    assert costs.splitlines()[0].split() == ["stage", "wall", "(s)"]  # local jobs: no GPU-hours claimed
    assert costs.endswith("note: 9 job(s) of the local executor: no accounting, their wall time only")
    records = warm_store.jobs(local_run)
    assert len(rows) == len(records) == 9  # checkpoint, 2 evaluations, 6 training stages
    for row in rows:
        path = Path(row.split()[-1])
        assert path.is_file() and path.name.endswith("_0_log.out"), row
    assert {row.split()[-1] for row in rows} == {f"{r['folder']}/{r['job_id']}_0_log.out" for r in records}


def test_logs_prints_the_last_jobs_files_under_headers(local_run: str, warm_store: ArtifactStore):
    result = probepo("logs", local_run, "--store", warm_store.url)
    assert result.returncode == 0, result.stderr
    last = warm_store.jobs(local_run, 1, "evaluate")[-1]  # the final evaluation was submitted last
    out = Path(last["folder"]) / f"{last['job_id']}_0_log.out"
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"job {last['job_id']} (update 1, stage evaluate; local, COMPLETED")
    assert f"==> {out} <==" in lines and f"==> {out.with_suffix('.err')} <==" in lines
    assert "Job completed successfully" in result.stdout  # submitit's line in the job's stdout
    assert out.read_text().strip() in result.stdout


def test_logs_of_one_stage_with_tail(local_run: str, warm_store: ArtifactStore):
    result = probepo(
        "logs", local_run, "--update", "0", "--stage", "sample", "--tail", "3", "--store", warm_store.url
    )
    assert result.returncode == 0, result.stderr
    job = warm_store.jobs(local_run, 0, "sample")[-1]
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"job {job['job_id']} (update 0, stage sample")
    headers = [i for i, line in enumerate(lines) if line.startswith("==> ")]
    assert [lines[i] for i in headers] == [
        f"==> {job['folder']}/{job['job_id']}_0_log.{stream} <==" for stream in ("out", "err")
    ]
    assert len(Path(lines[headers[0]][4:-4]).read_text().splitlines()) > 3  # submitit's stdout: cut to 3
    for start, end in zip(headers, [*headers[1:], len(lines)], strict=True):
        body = lines[start + 1 : end]
        full = Path(lines[start][4:-4]).read_text().splitlines()
        assert len(body) <= 3 and body == full[-3:]  # the last 3 lines, or the whole of a shorter file


def test_a_run_without_jobs_and_a_stage_without_jobs_are_one_error_line(
    local_run: str, warm_store: ArtifactStore
):
    train(one_update(), "logs-inline", store=warm_store)
    line = one_error_line(probepo("logs", "logs-inline", "--store", warm_store.url))
    assert "run logs-inline has no stage jobs: it ran inline" in line and "--executor" in line
    line = one_error_line(probepo("logs", local_run, "--stage", "driver", "--store", warm_store.url))
    assert f"run {local_run} has no job for --stage driver" in line
    assert "checkpoint (update 0), evaluate (updates 0-1), sample (update 0)" in line
    line = one_error_line(probepo("logs", local_run, "--task", "1", "--store", warm_store.url))
    assert "--task 1:" in line and "has only task 0" in line
