"""Suite-wide settings (one torch thread per process: measured faster than 2 under load), the real S3
endpoint that store and pipeline tests share (a moto server in its own process, started on first use),
stores holding the tiny recipe's warm-up, made once per session, and the tiny Qwen2 model of the Hugging
Face, vLLM and DeepSpeed tests (built and trained once per session, ~20 s)."""

import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import pytest
from hypothesis import settings

from tests import clusters
from tests.s3server import S3Server, isolated_aws_env, running_s3_server, start_s3_server

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch reads it
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch

from probepo.run.pipeline import ensure_warmup
from probepo.store import ArtifactStore, open_store
from tests.hf.tiny_qwen import TinyQwen, build_tiny_qwen
from tests.pipeline.conftest import FINAL_FILES, LONG_UPDATES, every_config, tiny_config

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parent.parent
UNIT_SECONDS = ROOT / "tests" / "unit_seconds.json"
"""Measured seconds of each work unit, from the reports of a whole run with PROBEPO_RECORD_UNIT_SECONDS
naming this file: the units are handed out longest first, so that no long unit starts last."""
unit_seconds: dict[str, float] = {}
"""This run's seconds per unit (setup, call and teardown of its tests), summed where the reports arrive."""
ORIGINAL_SLURM = {key: os.environ[key] for key in clusters.SLURM_KEYS if key in os.environ}
"""The SLURM environment the session started with (.ci/run's: the main cluster): a test of no cluster's
group runs with it."""


def work_unit(nodeid: str) -> str:
    """The xdist work unit of a test: its cluster's group (tests/clusters.py), run in order in one worker,
    else its module (so that its module-scoped fixtures are made once)."""
    cluster = clusters.cluster_of(nodeid)
    return f"cluster {cluster}" if cluster else nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each unit's tests together, in their order, the units longest first by their measured seconds (new
    ones last): xdist's scheduler hands them out in this order."""
    measured = json.loads(UNIT_SECONDS.read_text()) if UNIT_SECONDS.exists() else {}
    units = dict.fromkeys(work_unit(item.nodeid) for item in items)
    first_seen = {unit: index for index, unit in enumerate(units)}

    def order(item: pytest.Item) -> tuple[float, int]:
        unit = work_unit(item.nodeid)
        return (-measured.get(unit, 0.0), first_seen[unit])

    items.sort(key=order)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Work units of `pytest -n N` (scripts/test), in the collection's order (longest first): a scheduler of
    our own because xdist's `loadgroup` marks do not take under pytest 9.2 (xdist 3.8 renames node ids in a
    way pytest 9.2 ignores), and because xdist's would reorder the units by their number of tests."""
    from xdist.scheduler import LoadScopeScheduling
    from xdist.workermanage import WorkerController

    class LongestUnitsFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def _reschedule(self, node: WorkerController) -> None:
            # A worker keeps its last test back until more arrive: top it up only then, not while two
            # remain (xdist's default), so that no unit waits behind a long test while a worker idles.
            if node.shutting_down or (self.workqueue and self._pending_of(self.assigned_work[node]) > 1):
                return
            super()._reschedule(node)

    config.option.loadscopereorder = False
    return LongestUnitsFirst(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before any fixture of the test: its commands and jobs go to its group's cluster, or to the session's
    own SLURM environment when it belongs to none."""
    cluster = clusters.cluster_of(item.nodeid)
    for key in clusters.SLURM_KEYS:
        os.environ.pop(key, None)
    os.environ.update(clusters.environment(cluster) if cluster else ORIGINAL_SLURM)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    unit = work_unit(report.nodeid)
    unit_seconds[unit] = unit_seconds.get(unit, 0.0) + report.duration


xdist_controller = False
"""Whether this process hands tests to xdist workers (it runs none: it only relays their reports)."""
test_started: dict[str, tuple[float, os.times_result]] = {}
"""Wall clock and CPU times at each running test's start (PROBEPO_RECORD_TEST_CPU only)."""


def pytest_configure(config: pytest.Config) -> None:
    global xdist_controller
    xdist_controller = getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput")


def pytest_runtest_logstart(nodeid: str) -> None:
    if os.environ.get("PROBEPO_RECORD_TEST_CPU") and not xdist_controller:
        test_started[nodeid] = (time.time(), os.times())


def pytest_runtest_logfinish(nodeid: str) -> None:
    """With PROBEPO_RECORD_TEST_CPU naming a file, one JSON line per test: its wall span and the CPU-seconds
    its worker and the worker's waited-for children (local subprocesses) spent on it, setup and teardown
    included. Jobs that SLURM ran are not children: scripts/test_cpu.py adds them from sacct by span."""
    path = os.environ.get("PROBEPO_RECORD_TEST_CPU")
    if not path or nodeid not in test_started:
        return
    started, before = test_started.pop(nodeid)
    after = os.times()
    record = {
        "test": nodeid,
        "cluster": clusters.cluster_of(nodeid),
        "start": started,
        "end": time.time(),
        "cpu_s": round(after.user + after.system - before.user - before.system, 2),
        "children_cpu_s": round(
            after.children_user + after.children_system - before.children_user - before.children_system, 2
        ),
    }
    with open(path, "a") as out:  # one short line per write: whole under O_APPEND across the workers
        out.write(json.dumps(record) + "\n")


def pytest_sessionfinish(session: pytest.Session) -> None:
    clusters.stop_started_here()
    path = os.environ.get("PROBEPO_RECORD_UNIT_SECONDS")
    if path and not hasattr(session.config, "workerinput"):  # xdist's controller: it has every report
        rounded = {unit: round(seconds, 1) for unit, seconds in sorted(unit_seconds.items())}
        Path(path).write_text(json.dumps(rounded, indent=1) + "\n")


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
    from probepo.run.pipeline import train

    train(every_config(1), "every-1", store=warm_store)
    files = warm_store.read_stage("every-1", LONG_UPDATES, "checkpoint")
    return {name: files[name] for name in FINAL_FILES}


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory: pytest.TempPathFactory) -> TinyQwen:
    """Built once per run (~20 CPU-s): xdist's workers share the run's temporary root, where the first to
    need it builds it under a lock and the others load its tokenizer back. Tests only read its folder."""
    from filelock import FileLock
    from transformers.utils import logging

    from probepo.engines.hf.loading import load_tokenizer

    logging.disable_progress_bar()  # "Loading weights" bars on every from_pretrained
    root = tmp_path_factory.getbasetemp()
    shared = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    folder, built = shared / "tiny-qwen", shared / "tiny-qwen.built"
    with FileLock(shared / "tiny-qwen.lock"):
        if built.exists():
            return TinyQwen(folder, load_tokenizer(folder))
        model = build_tiny_qwen(folder)
        built.touch()
        return model


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
