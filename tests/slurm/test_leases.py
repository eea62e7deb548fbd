"""A run's lease left by a driver job, judged by SLURM's accounting (slurm.holders): a holder job that
ended is taken over at once, though the lease names another node and has not expired, by the job
resubmitted in its place and by `probepo resume`; a pending or running one is not. The holder jobs are
real jobs of the test cluster: one that exited 1 (FAILED), one sleeping (cancelled at the end)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from probepo.run.driver_lease import LEASE_TTL_S, take_lease
from probepo.run.execution import StageRequest
from probepo.run.schedule import Stage
from probepo.store import ArtifactStore, JobOutcome, LeaseHeld, open_store, read_lease
from probepo.store.formats import to_json_bytes
from probepo.store.keys import RunLayout
from slurm.accounting import job_states
from slurm.holders import holder_ended
from slurm.job import run_driver_job
from tests.slurm.conftest import drill_config
from tests.slurm.drill import slurm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FOREIGN_HOST = "gpu-node-17"
"""Where the planted holder ran: no host of this cluster, so its pid means nothing here."""
COMPLETE_RUN = "drill-inline"
"""drill_baseline's run, complete: a driver that gets its lease only says so."""


def _job(command: str) -> str:
    """A job of the test cluster running `command`; its id."""
    sbatch = ("sbatch", "--parsable", "-p", "low", "-o", "/dev/null", "-J", "lease-holder", "--wrap")
    return slurm(*sbatch, command).strip()


def _state(job_id: str, wanted: set[str], timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    state = ""
    while time.monotonic() < deadline:
        state = job_states([job_id])[job_id].state
        if state in wanted:
            return state
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} is {state}, not {' or '.join(sorted(wanted))}, after {timeout_s} s")


@pytest.fixture(scope="module")
def failed_job(slurm_cluster) -> str:
    job_id = _job("exit 1")
    _state(job_id, {"FAILED"})
    return job_id


@pytest.fixture(scope="module")
def running_job(slurm_cluster) -> Iterator[str]:
    job_id = _job("sleep 600")
    try:
        _state(job_id, {"RUNNING", "PENDING"})  # pending while the node is busy: alive all the same
        yield job_id
    finally:
        slurm("scancel", job_id)


def _plant(store: ArtifactStore, run_id: str, job_id: str) -> None:
    """The lease as the driver of job `job_id` wrote it on another node, 10 minutes from expiring."""
    record = {
        "holder": f"slurm-job-{job_id}",
        "host": FOREIGN_HOST,
        "pid": 4242,
        "token": "planted",
        "ttl_s": LEASE_TTL_S,
        "expires_at": "in 10 minutes",
        "expires_at_epoch": time.time() + LEASE_TTL_S,
    }
    store.objects.put_bytes(RunLayout(run_id).lease, to_json_bytes(record))


def test_accounting_says_which_holders_ended(failed_job, running_job):
    assert holder_ended({"holder": f"slurm-job-{failed_job}", "host": FOREIGN_HOST}) is True
    assert holder_ended({"holder": f"slurm-job-{running_job}", "host": FOREIGN_HOST}) is False
    assert holder_ended({"holder": f"{FOREIGN_HOST}:4242", "host": FOREIGN_HOST}) is None  # no job
    assert holder_ended({"holder": "slurm-job-66999999", "host": FOREIGN_HOST}) is None  # no such job


def test_a_failed_driver_jobs_lease_is_taken_over_at_once_and_a_running_ones_is_not(
    tmp_path, failed_job, running_job
):
    store = open_store(tmp_path / "store")
    _plant(store, "failed", failed_job)
    with pytest.raises(LeaseHeld, match=f"slurm-job-{failed_job}"):
        take_lease(store, "failed")  # without accounting, only the expiry would free it
    with take_lease(store, "failed", holder_ended=holder_ended) as lease:
        assert lease.replaced is not None and lease.replaced["holder"] == f"slurm-job-{failed_job}"
    _plant(store, "running", running_job)
    with pytest.raises(LeaseHeld, match=f"slurm-job-{running_job}.*{FOREIGN_HOST}"):
        take_lease(store, "running", holder_ended=holder_ended)


def test_the_resubmitted_driver_job_takes_the_failed_ones_lease_over(
    warm_store, drill_baseline, failed_job, tmp_path
):
    import submitit

    _plant(warm_store, COMPLETE_RUN, failed_job)
    executor = submitit.SlurmExecutor(folder=tmp_path / "jobs", max_num_timeout=0)
    executor.update_parameters(partition="low", time=10)
    request = StageRequest(warm_store.url, COMPLETE_RUN, 0, Stage.DRIVER, drill_config().model_dump_json())
    resubmitted = executor.submit(run_driver_job, request, "SLURM_JOB_ID")
    assert resubmitted.result() == JobOutcome.COMMITTED  # a LeaseHeld would raise here, with its traceback
    assert read_lease(warm_store, COMPLETE_RUN) is None  # taken, then released at the end


def test_resume_takes_over_a_failed_driver_jobs_lease_and_refuses_a_running_ones(
    warm_store, drill_baseline, failed_job, running_job, tmp_path
):
    command = [sys.executable, "-m", "probepo.cli", "resume", COMPLETE_RUN, "--store", warm_store.url]
    command += ["--tensorboard", str(tmp_path / "events")]
    _plant(warm_store, COMPLETE_RUN, failed_job)
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=120, env=os.environ)
    assert resumed.returncode == 0, resumed.stderr
    assert (
        f"run {COMPLETE_RUN} is complete" in resumed.stdout and read_lease(warm_store, COMPLETE_RUN) is None
    )
    _plant(warm_store, COMPLETE_RUN, running_job)
    try:
        refused = subprocess.run(command, capture_output=True, text=True, timeout=120, env=os.environ)
        assert refused.returncode == 2 and f"slurm-job-{running_job}" in refused.stderr, refused.stderr
        assert "--take-over" in refused.stderr
    finally:
        warm_store.objects.delete(RunLayout(COMPLETE_RUN).lease)
