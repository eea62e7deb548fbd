"""Store outages on the real cluster, the store on Ceph's RADOS Gateway, whose objects survive a restart of
the gateway alone (infra/s3/ceph/gateway.sh stops and starts it; moto keeps nothing across one):

(a) a short outage while the resident job commits, and (b) while a stage job of the slurm executor commits:
each job waits for the store, commits once it answers, and the run finishes by itself, bitwise equal to an
uninterrupted run, nothing submitted again, the wait counted as `store_wait`;
(c) an outage longer than the profile's `store_outage_s` while the resident job commits: the job gives up
(exit STORE_UNREACHABLE_EXIT), the driver waiting for it says the store is unreachable and submits it again
once the gateway answers (a death of the store's, named so), and the run resumes by itself, bitwise equal;
(d), the same give-up with the local executor, is tests/slurm/test_store_outage_local.py.

The outages are short for the suite (15 s; 20 s against an 8 s deadline). A longer one only waits longer:
a job rides out up to `store_outage_s` (10 minutes by default), the waiting driver any length; past the
deadline each resubmission, once the store answers, costs a job's start and what was not committed
(max_resubmits deaths in a row with nothing committed end the run, as any deaths do).
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import pytest
import yaml

from probepo.run.pipeline import ensure_warmup
from probepo.store import ArtifactStore, open_store
from probepo.store.s3 import _session as store_sessions
from slurm.job_ends import STORE_CAUSE
from slurm.logs import log_path
from tests.clusters import ROOT
from tests.pipeline.conftest import FINAL_FILES, LONG_UPDATES, every_config, tiny_config
from tests.s3server import S3Server, isolated_aws_env
from tests.slurm.conftest import drill_config
from tests.slurm.drill import Drill

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

GATEWAY = ROOT / "infra" / "s3" / "ceph" / "gateway.sh"
SHORT_OUTAGE_S = 15.0
LONG_OUTAGE_S = 20.0
SHORT_DEADLINE_S = 8.0
RESIDENT_PAUSE = "1:optimize:before-commit"  # policy 2 then lives only in the resident job's memory
STAGE_PAUSE = "0:sample:before-commit"


def gateway(action: str) -> None:
    done = subprocess.run(["bash", str(GATEWAY), action], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"gateway.sh {action}: {done.stderr}"


def outage(seconds: float, meanwhile: Callable[[], None]) -> None:
    """The gateway stopped for `seconds`, `meanwhile` done as it goes down; started again whatever
    happens."""
    gateway("stop")
    try:
        meanwhile()
        time.sleep(seconds)
    finally:
        gateway("start")


@pytest.fixture(scope="module")
def rgw(rgw_drill_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """This process, its drivers and their jobs reach RGW through the gateway the drills stop (the other
    tests' gateway goes on), with a credentials file (a job never gets keys in its environment:
    probepo.config.execution.DEFAULT_ENV_ALLOW)."""
    rgw_server = rgw_drill_server
    keys = {name: rgw_server.env[name] for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    credentials = tmp_path_factory.mktemp("rgw") / "credentials"
    credentials.write_text(
        f"[default]\naws_access_key_id = {keys['AWS_ACCESS_KEY_ID']}\n"
        f"aws_secret_access_key = {keys['AWS_SECRET_ACCESS_KEY']}\n"
    )
    saved = dict(os.environ)
    for name in keys:
        os.environ.pop(name, None)
    os.environ.update(
        {
            key: value
            for key, value in isolated_aws_env(rgw_server).items()
            if key not in keys and key != "AWS_SHARED_CREDENTIALS_FILE"
        }
    )
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = str(credentials)
    boto3.DEFAULT_SESSION = None
    store_sessions.cache_clear()
    yield
    os.environ.clear()
    os.environ.update(saved)
    boto3.DEFAULT_SESSION = None
    store_sessions.cache_clear()


@pytest.fixture(scope="module")
def rgw_store(rgw: None) -> ArtifactStore:
    """A store in a fresh RGW bucket holding the tiny recipe's warm-up."""
    bucket = f"outage-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    store = open_store(f"s3://{bucket}/runs")
    ensure_warmup(tiny_config(), store)
    return store


def waiting_up_to(profile_path: Path, store_outage_s: float) -> Path:
    """The test cluster's profile with this `store_outage_s`."""
    fields = yaml.safe_load(profile_path.read_text())
    path = profile_path.with_name(f"profile-outage-{store_outage_s:g}.yaml")
    path.write_text(yaml.safe_dump({**fields, "store_outage_s": store_outage_s}))
    return path


def store_wait(store: ArtifactStore, run_id: str, update: int, stage: str) -> float:
    """The seconds the stage's attempts waited for the store."""
    return sum(
        float((a.get("spend") or {}).get("seconds", {}).get("store_wait", 0.0))
        for a in store.attempts(run_id, update, stage)
    )


def job_stderr(store: ArtifactStore, run_id: str, update: int, stage: str, index: int = 0) -> str:
    return log_path(store.jobs(run_id, update, stage)[index], stream="err").read_text()  # type: ignore[union-attr]


def assert_uninterrupted_bits(drill: Drill, reference: dict[str, bytes]) -> None:
    final = drill.store.read_stage(drill.run_id, LONG_UPDATES, "checkpoint")
    assert {name: final[name] for name in FINAL_FILES} == reference
    for update, stages in drill.store.ledger_entries(drill.run_id).items():
        for stage in stages:
            outcomes = [a["outcome"] for a in drill.store.attempts(drill.run_id, update, stage)]
            assert outcomes.count("committed") <= 1, (update, stage, outcomes)
    assert {m["update"] for m in drill.store.read_metrics(drill.run_id)} == set(range(LONG_UPDATES + 1))


def test_a_short_outage_during_a_resident_run_is_waited_out(
    rgw_store, tmp_path, profile_path, every_update_reference
):
    profile = waiting_up_to(profile_path, 120)
    drill = Drill(rgw_store, "outage-resident", tmp_path, profile, every_config(3), executor="resident")
    drill.pause = (RESIDENT_PAUSE,)
    drill.train()
    drill.paused_at(RESIDENT_PAUSE)
    outage(SHORT_OUTAGE_S, drill.release.touch)  # the job goes on into its commit, the store gone
    drill.finish()

    assert_uninterrupted_bits(drill, every_update_reference)
    [job] = rgw_store.jobs(drill.run_id, 0, "driver")
    assert job["outcome"] == "committed"  # one job did it all, never submitted again
    assert store_wait(rgw_store, drill.run_id, 1, "optimize") > SHORT_OUTAGE_S / 2
    said = job_stderr(rgw_store, drill.run_id, 0, "driver")
    assert "store unreachable since" in said and "store answers again after" in said
    assert "store unreachable since" in drill.log()  # the process following the job went on


def test_a_short_outage_during_a_stage_job_is_waited_out(rgw_store, tmp_path, profile_path, drill_baseline):
    drill = Drill(rgw_store, "outage-stage", tmp_path, waiting_up_to(profile_path, 120), drill_config())
    drill.pause = (STAGE_PAUSE,)
    drill.train()
    drill.paused_at(STAGE_PAUSE)
    outage(SHORT_OUTAGE_S, drill.release.touch)
    drill.finish()

    drill.check(drill_baseline)
    assert drill.submissions(0, "sample") == 1
    assert [a["outcome"] for a in rgw_store.attempts(drill.run_id, 0, "sample")] == ["committed"]
    assert store_wait(rgw_store, drill.run_id, 0, "sample") > SHORT_OUTAGE_S / 2
    said = job_stderr(rgw_store, drill.run_id, 0, "sample")
    assert "store unreachable since" in said and "store answers again after" in said


def test_an_outage_past_store_outage_s_resubmits_the_resident_job_once_the_store_answers(
    rgw_store, tmp_path, profile_path, every_update_reference
):
    profile = waiting_up_to(profile_path, SHORT_DEADLINE_S)
    drill = Drill(rgw_store, "outage-long", tmp_path, profile, every_config(3), executor="resident")
    drill.pause = (RESIDENT_PAUSE,)
    drill.train()
    drill.paused_at(RESIDENT_PAUSE)
    outage(LONG_OUTAGE_S, drill.release.touch)
    drill.finish()

    assert_uninterrupted_bits(drill, every_update_reference)
    first, second = rgw_store.jobs(drill.run_id, 0, "driver")
    assert (first["outcome"], first.get("cause"), second["outcome"]) == ("died", STORE_CAUSE, "committed")
    assert first["exit_code"].split(":")[0] == "69"  # STORE_UNREACHABLE_EXIT
    gave_up = job_stderr(rgw_store, drill.run_id, 0, "driver")
    assert "cannot connect" in gave_up and "past store_outage_s" in gave_up
    said = drill.log()
    assert "store unreachable since" in said and f"{STORE_CAUSE}; submitted again (death 1 in a row)" in said
    # the second job took over the lease of the first (accounting shows it ended) and rebuilt by replaying
    # the policy that lived only in the first one's memory
    assert any(a.get("replayed_updates") for a in rgw_store.attempts(drill.run_id))
