"""A stage job that gave up on an unreachable store is submitted again, with the local executor: moto behind
a link the test cuts (tests/store/cuttable_link.py) for longer than the job's `store_outage_s`; the job gives
up, its runner submits it again once the link is back, and the run ends bitwise equal to the inline run.
It needs neither the SLURM cluster nor Ceph, so it runs beside the shared services (tests/conftest.py), in
a module of its own: the RGW drills of test_store_outage.py point this process's environment at their
gateway for their whole module."""

from __future__ import annotations

import threading
import time

import boto3
import pytest

from probepo.config import ExecutionProfile, StageResources
from probepo.run.faults import PAUSE_ENV, PAUSE_MARK_ENV, PAUSE_RELEASE_ENV
from probepo.run.pipeline import train
from probepo.store import open_store
from probepo.store.outage import RIDER, OutageBudget
from probepo.store.s3 import _session as store_sessions
from slurm import make_runner
from slurm.logs import log_path
from tests.pipeline.conftest import FINAL_FILES
from tests.s3server import TEST_CREDENTIALS, isolated_aws_env
from tests.slurm.conftest import drill_config
from tests.slurm.test_store_outage import LONG_OUTAGE_S, STAGE_PAUSE
from tests.store.cuttable_link import CuttableLink

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def test_a_stage_job_that_gave_up_on_the_store_is_submitted_again_by_the_local_executor(
    s3_server, s3_warm_store, drill_baseline, tmp_path, monkeypatch
):
    credentials = tmp_path / "aws-credentials"  # how a job reaches S3: keys never travel in its environment
    credentials.write_text(
        f"[default]\naws_access_key_id = {TEST_CREDENTIALS['AWS_ACCESS_KEY_ID']}\n"
        f"aws_secret_access_key = {TEST_CREDENTIALS['AWS_SECRET_ACCESS_KEY']}\n"
    )
    for variable, value in isolated_aws_env(s3_server).items():  # moto's, whatever an earlier test set
        monkeypatch.setenv(variable, value)
    link = CuttableLink(s3_server.endpoint_url)
    mark, release = tmp_path / "paused", tmp_path / "release"
    for variable, value in {
        "AWS_ENDPOINT_URL_S3": link.endpoint_url,  # the driver and its jobs reach moto through the link
        "AWS_SHARED_CREDENTIALS_FILE": str(credentials),
        PAUSE_ENV: STAGE_PAUSE,
        PAUSE_MARK_ENV: str(mark),
        PAUSE_RELEASE_ENV: str(release),
    }.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    store_sessions.cache_clear()
    profile = ExecutionProfile(
        job_folder=str(tmp_path / "jobs"),
        poll_s=0.2,
        poll_max_s=0.2,
        store_outage_s=3,
        defaults=StageResources(time_min=15, signal_grace_s=30),
    )

    def cut_when_paused() -> None:
        deadline = time.monotonic() + 300
        while not mark.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        link.down()
        release.touch()
        time.sleep(LONG_OUTAGE_S / 2)  # past the job's 3 s: it gives up
        link.up()

    cutter = threading.Thread(target=cut_when_paused, daemon=True)
    cutter.start()
    store = open_store(s3_warm_store.url)
    try:
        with RIDER.configured(OutageBudget(profile.store_outage_s)):  # as `probepo train` does
            train(drill_config(), "outage-local", store=store, runner=make_runner("local", profile))
    finally:
        cutter.join(timeout=60)
        link.down()
        store_sessions.cache_clear()

    final = s3_warm_store.read_stage("outage-local", 1, "checkpoint")  # moto itself, not the link
    assert {name: final[name] for name in FINAL_FILES} == drill_baseline
    first, second = s3_warm_store.jobs("outage-local", 0, "sample")
    assert (first["outcome"], second["outcome"]) == ("died", "committed")
    # submitit's local controller exits 0 whatever its task did: the death's cause is not told apart here
    gave_up = log_path(first, stream="err").read_text()  # type: ignore[union-attr]
    assert "cannot connect" in gave_up and "past store_outage_s" in gave_up
