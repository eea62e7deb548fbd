"""The nightly's array tasks on the real SLURM cluster: a task preempted mid-suite by a job of the high
partition keeps its shards, requeues itself and ends with the numbers of a twin run's uninterrupted
evaluation; a task sent its time limit's warning abandons the shard in flight at once, requeues itself
(SLURM requeues no job at its time limit) and ends the same; a task killed outright (its time limit's kill
past the grace window, a lost node) leaves its shards, and the next night's task makes only the missing
ones. Each suite here is 4 engine calls (batch rows 4 over 16 problems)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from probepo.config import RunConfig
from probepo.presets import load_profile
from probepo.run.evaluations import EvaluationRequest, evaluate_checkpoint
from probepo.run.faults import PAUSE_ENV, PAUSE_MARK_ENV, PAUSE_RELEASE_ENV
from probepo.run.pipeline import train
from slurm.arrays import ItemOutcome, run_array
from tests.pipeline.conftest import tiny_config
from tests.slurm.drill import accounted_states
from tests.slurm.test_drill import preempt_with_a_high_job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

FIRST_SHARD = "evaluate.heldout.shard-0000"
SECOND_SHARD = "evaluate.heldout.shard-0001"


@pytest.fixture(scope="module")
def twins(warm_store):
    """Two runs of one recipe, 3 updates, evaluated in the run at policies 0 and 3 only."""
    sampling = {**RunConfig().sampling.model_dump(), "batch_rows": 4}
    evaluated_at_ends = {**tiny_config().eval.model_dump(), "every": 10}
    for run_id in ("nightly-a", "nightly-b"):
        config = tiny_config(num_updates=3, store=warm_store.url, sampling=sampling, eval=evaluated_at_ends)
        train(config, run_id, store=warm_store)
    return warm_store


def _night(store, checkpoint: int, profile: Path, outcomes: list[ItemOutcome]) -> threading.Thread:
    request = EvaluationRequest(store.url, "nightly-a", checkpoint, "heldout")
    night = threading.Thread(
        target=lambda: outcomes.extend(
            run_array("slurm", evaluate_checkpoint, [request], load_profile(str(profile)), name="nightly")
        )
    )
    night.start()
    return night


def _paused(mark: Path, point: str, timeout_s: float = 240.0) -> int:
    deadline = time.monotonic() + timeout_s
    while not (mark.exists() and mark.read_text().split()[1:] == [point]):
        assert time.monotonic() < deadline, f"no task paused at {point}"
        time.sleep(0.1)
    pid = int(mark.read_text().split()[0])
    mark.unlink()
    return pid


def _twin(store, checkpoint: int) -> dict:
    twin = EvaluationRequest(store.url, "nightly-b", checkpoint, "heldout")
    if store.evaluation("nightly-b", checkpoint, "heldout") is None:
        assert evaluate_checkpoint(twin) == "evaluated"
    return store.evaluation("nightly-b", checkpoint, "heldout")


@pytest.fixture
def pausing(monkeypatch, tmp_path, profile_path) -> Path:
    monkeypatch.setenv(PAUSE_MARK_ENV, str(tmp_path / "paused"))
    monkeypatch.setenv(PAUSE_RELEASE_ENV, str(tmp_path / "release"))
    return tmp_path / "paused"


def test_a_preempted_task_keeps_its_shards_requeues_and_ends_with_the_twins_numbers(
    twins, pausing, monkeypatch, profile_path
):
    point = f"1:{FIRST_SHARD}:after-commit"
    monkeypatch.setenv(PAUSE_ENV, point)
    outcomes: list[ItemOutcome] = []
    night = _night(twins, 1, profile_path, outcomes)
    _paused(pausing, point)
    monkeypatch.delenv(PAUSE_ENV)  # the job has it; the twin's evaluation here must not pause
    assert twins.evaluation_shard_names("nightly-a", 1, "heldout") == [FIRST_SHARD]
    preempt_with_a_high_job()
    night.join(timeout=300)
    (outcome,) = outcomes
    assert outcome.error is None and outcome.result == "resumed", outcome
    record = twins.evaluation("nightly-a", 1, "heldout")
    assert (record["resumed_shards"], record["shards"]) == (1, 4)
    twin = _twin(twins, 1)
    assert (record["mean"], record["per_problem"]) == (twin["mean"], twin["per_problem"])
    assert twins.evaluation_shard_names("nightly-a", 1, "heldout") == []
    runs = accounted_states(outcome.job_id)
    assert len(runs) >= 2 and runs[0] in ("REQUEUED", "PREEMPTED"), runs  # the same task, run again


def test_a_task_warned_of_its_time_limit_abandons_the_call_in_flight_requeues_and_ends_with_the_twins_numbers(
    twins, pausing, monkeypatch, profile_path, tmp_path
):
    """What a time limit sends `signal_grace_s` before it (`sbatch --signal=USR2@<s>`, no `B:`): USR2 to the
    job's steps, where submitit's Python runs; no SIGTERM, and no requeue by SLURM, which ends a job at its
    limit TIMEOUT. SLURM sends that warning at a periodic check (every 30 s), up to 60 s before the time
    asked for, so a real limit (a minute at least) would have this test wait a minute and race the kill:
    `scancel --signal=USR2` sends the same signal to the same processes, here while the task holds its
    second engine call, claimed and not yet decoded. This test exercises that path, not SLURM's clock."""
    point = f"3:{SECOND_SHARD}:claimed"
    monkeypatch.setenv(PAUSE_ENV, point)
    outcomes: list[ItemOutcome] = []
    night = _night(twins, 3, profile_path, outcomes)
    first = _paused(pausing, point)
    monkeypatch.delenv(PAUSE_ENV)  # the job has it; the twin's evaluation here must not pause
    (script,) = (tmp_path / "jobs" / "nightly").glob("*_submission.sh")
    assert "#SBATCH --signal=USR2@30" in script.read_text()  # the warning: signal_grace_s before the limit
    running = subprocess.run(["squeue", "-h", "-n", "nightly", "-t", "RUNNING", "-o", "%i"],
                             capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    (job,) = running
    subprocess.run(["scancel", "--signal=USR2", job], check=True)
    again = _paused(pausing, point)  # the requeued task's next run, which claims the same call again
    assert again != first and twins.evaluation_shard_names("nightly-a", 3, "heldout") == [FIRST_SHARD]
    (tmp_path / "release").touch()
    night.join(timeout=300)
    (outcome,) = outcomes
    assert outcome.error is None and outcome.result == "resumed" and outcome.job_id == job, outcome
    record = twins.evaluation("nightly-a", 3, "heldout")
    assert (record["resumed_shards"], record["shards"], record["jobs"]) == (1, 4, [job])
    twin = _twin(twins, 3)
    assert (record["mean"], record["per_problem"]) == (twin["mean"], twin["per_problem"])
    runs = accounted_states(job)
    assert runs[0] == "REQUEUED" and runs[-1] == "COMPLETED", runs  # requeued by itself


def test_a_task_killed_outright_leaves_its_shards_and_the_next_night_makes_only_the_rest(
    twins, pausing, monkeypatch, profile_path
):
    point = f"2:{FIRST_SHARD}:after-commit"
    monkeypatch.setenv(PAUSE_ENV, point)
    outcomes: list[ItemOutcome] = []
    night = _night(twins, 2, profile_path, outcomes)
    pid = _paused(pausing, point)
    monkeypatch.delenv(PAUSE_ENV)  # the next night's task and the twin's evaluation go through
    os.kill(pid, signal.SIGKILL)  # no signal it could act on: as at a kill past the grace window
    night.join(timeout=300)
    (died,) = outcomes
    assert died.error is not None and twins.evaluation("nightly-a", 2, "heldout") is None
    assert twins.evaluation_shard_names("nightly-a", 2, "heldout") == [FIRST_SHARD]
    outcomes.clear()
    _night(twins, 2, profile_path, outcomes).join(timeout=300)  # the next night
    (outcome,) = outcomes
    assert outcome.error is None and outcome.result == "resumed", outcome
    record = twins.evaluation("nightly-a", 2, "heldout")
    assert (record["resumed_shards"], record["shards"]) == (1, 4)
    twin = _twin(twins, 2)
    assert (record["mean"], record["per_problem"]) == (twin["mean"], twin["per_problem"])
