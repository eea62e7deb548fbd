"""Suite-wide settings (one torch thread per process: measured faster than 2 under load), the real S3
endpoint that store and pipeline tests share (a moto server in its own process, started on first use),
stores holding the tiny recipe's warm-up, made once per session, and the tiny Qwen2 model of the Hugging
Face, vLLM and DeepSpeed tests (built and trained once per session, ~20 s)."""

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import pytest
from hypothesis import settings

from tests.s3server import S3Server, isolated_aws_env, running_s3_server, start_s3_server

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch reads it
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch

from probepo.pipeline import ensure_warmup
from probepo.store import ArtifactStore, open_store
from tests.hf.tiny_qwen import TinyQwen, build_tiny_qwen
from tests.pipeline.conftest import FINAL_FILES, LONG_UPDATES, every_config, tiny_config

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parent.parent
SHARED_SERVICES = (
    "tests/slurm/",
    "tests/flows/",
    "tests/deepspeed/test_engine.py",
    "tests/deepspeed/test_resident.py",
    "tests/deepspeed/test_two_nodes.py",
)
"""The tests that drive the one SLURM cluster and Prefect server: some take the node down, stop jobs or
preempt, so they run in one worker, one after another."""
OWN_SERVICES = ("tests/slurm/test_qos_preemption.py", "tests/slurm/test_store_outage_local.py")
"""Tests under SHARED_SERVICES' folders that use none of them (the QOS controller's drills, a local
executor's): a unit each, beside the shared services."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Work units of `pytest -n N` (scripts/test): SHARED_SERVICES as one, and every other module as one (so
    that its module-scoped fixtures are made once). A scheduler of its own because xdist's `loadgroup`
    marks do not take under pytest 9.2 (xdist 3.8 renames node ids in a way pytest 9.2 ignores)."""
    from xdist.scheduler import LoadScopeScheduling

    class SharedServicesInOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            shared = path.startswith(SHARED_SERVICES) and not path.startswith(OWN_SERVICES)
            return "shared services" if shared else path

    return SharedServicesInOneWorker(config, log)


# The suite is deterministic: property tests draw the same examples every run. HYPOTHESIS_PROFILE=explore
# draws fresh random examples each run, to hunt for new counterexamples locally.
settings.register_profile("deterministic", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One moto server for the session (the one `.ci/run` started, named by PROBEPO_TEST_S3_ENDPOINT, else
    one started here); boto3 in this process and its children points at it."""
    endpoint = os.environ.get("PROBEPO_TEST_S3_ENDPOINT")
    server = running_s3_server(endpoint) if endpoint else start_s3_server()
    saved = {key: os.environ.get(key) for key in isolated_aws_env(server)}
    os.environ.update(isolated_aws_env(server))
    try:
        yield server
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def rgw_server() -> S3Server:
    """Ceph's RADOS Gateway, the second S3 implementation the store is tested on: the one
    infra/s3/ceph/start.sh started (scripts/services.sh exports its PROBEPO_TEST_RGW_* variables).
    Skipped where none runs; the store tests point boto3 at it per test (tests/store/conftest.py)."""
    endpoint = os.environ.get("PROBEPO_TEST_RGW_ENDPOINT")
    if not endpoint:
        pytest.skip(
            "no Ceph RGW: PROBEPO_TEST_RGW_ENDPOINT is unset; start one as root with "
            '`eval "$(bash infra/s3/ceph/start.sh)"` (scripts/services.sh does)'
        )
    credentials = {
        "AWS_ACCESS_KEY_ID": os.environ["PROBEPO_TEST_RGW_ACCESS_KEY"],
        "AWS_SECRET_ACCESS_KEY": os.environ["PROBEPO_TEST_RGW_SECRET_KEY"],
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    return running_s3_server(endpoint, credentials)


@pytest.fixture(scope="session")
def rgw_drill_server(rgw_server: S3Server) -> S3Server:
    """The same Ceph cluster through its second gateway, the one the store-outage drills stop and start
    (infra/s3/ceph/gateway.sh): same users, buckets and objects as `rgw_server`'s."""
    endpoint = os.environ.get("PROBEPO_TEST_RGW_DRILL_ENDPOINT")
    if not endpoint:
        pytest.skip(
            "no drill gateway: PROBEPO_TEST_RGW_DRILL_ENDPOINT is unset (infra/s3/ceph/start.sh sets it)"
        )
    keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    return running_s3_server(endpoint, {key: rgw_server.env[key] for key in keys})


@pytest.fixture(scope="session")
def s3_admin(s3_server: S3Server):
    """A plain boto3 client on the test endpoint, for setting up buckets."""
    return boto3.client("s3", endpoint_url=s3_server.endpoint_url)


@pytest.fixture
def s3_bucket(s3_admin) -> str:
    """A fresh, empty bucket on the test endpoint."""
    name = f"test-{uuid.uuid4().hex[:16]}"
    s3_admin.create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def warm_store(tmp_path_factory: pytest.TempPathFactory) -> ArtifactStore:
    """A local store holding the tiny recipe's warm-up checkpoint (made once per session)."""
    folder: Path = tmp_path_factory.mktemp("store")
    store = open_store(folder)
    ensure_warmup(tiny_config(), store)
    return store


@pytest.fixture(scope="session")
def s3_warm_store(s3_admin) -> ArtifactStore:
    """A store on the S3 endpoint holding the tiny recipe's warm-up checkpoint (made once per session)."""
    bucket = f"warm-{uuid.uuid4().hex[:12]}"
    s3_admin.create_bucket(Bucket=bucket)
    store = open_store(f"s3://{bucket}/team/runs")
    ensure_warmup(tiny_config(), store)
    return store


@pytest.fixture(scope="session")
def every_update_reference(warm_store: ArtifactStore) -> dict[str, bytes]:
    """The final checkpoint files of `every_config(1)` trained inline, uninterrupted (run `every-1`)."""
    from probepo.pipeline import train

    train(every_config(1), "every-1", store=warm_store)
    files = warm_store.read_stage("every-1", LONG_UPDATES, "checkpoint")
    return {name: files[name] for name in FINAL_FILES}


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory: pytest.TempPathFactory) -> TinyQwen:
    from transformers.utils import logging

    logging.disable_progress_bar()  # "Loading weights" bars on every from_pretrained
    return build_tiny_qwen(tmp_path_factory.mktemp("tiny-qwen"))


@pytest.fixture
def scratch_of_killed_runs() -> Iterator[Callable[[str], None]]:
    """`forget(run_id)`: after the test, remove the run's scratch folders (`probepo-<run_id>-*` in the temp
    dir). A process the test SIGKILLs leaves its scratch behind, and a real model's holds ~100 MB
    checkpoints; other runs' folders, maybe in use by another test worker, are left alone."""
    runs: list[str] = []
    yield runs.append
    for run_id in runs:
        for folder in Path(tempfile.gettempdir()).glob(f"probepo-{run_id}-*"):
            shutil.rmtree(folder, ignore_errors=True)
