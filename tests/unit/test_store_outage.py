"""Riding out an unreachable store (probepo/store/outage.py), against a fake clock (no sleeps): the capped
exponential backoff, the deadline (store_outage_s, or the job's time limit less its grace before it), what
is said and when, the seconds counted once in the attempt's `store_wait`, the lease holder's fence; which
botocore failures are an outage (a real client against a closed port among them); and the job runner,
whose waits never fail of an unreachable store and which submits again a job that gave up on it. The same
on a real endpoint: tests/store/test_outage.py; on the real cluster with Ceph's gateway stopped:
tests/slurm/test_store_outage.py."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from probepo import spend
from probepo.config import ExecutionProfile, RunConfig
from probepo.run.execution import StageRequest
from probepo.run.schedule import Stage
from probepo.stages.context import StageContext
from probepo.store import ArtifactStore, LeaseLost, StoreError, StoreOutage, open_store
from probepo.store.outage import Clock, OutageBudget, Rider, WriteFence
from probepo.store.s3 import _session as store_sessions
from probepo.store.s3_errors import translated_errors
from slurm.job_ends import STORE_CAUSE
from slurm.runner import DriverStopped, JobRunner, StageFailed
from tests.s3server import TEST_CREDENTIALS, free_port
from tests.unit.fake_backend import FakeBackend, Poll, committing, job

DOWN = (
    "S3 endpoint http://127.0.0.1:1, bucket 'b': cannot connect (EndpointConnectionError) while trying to"
    " read 'k'"
)


class FakeClock(Clock):
    """Time that moves only when slept through; `on_sleep` runs after each sleep (a renewal, an interrupt)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []
        self.on_sleep: Callable[[], None] = lambda: None

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return 1_750_000_000.0 + self.now

    def sleep(self, seconds: float, interrupt: threading.Event | None) -> bool:
        self.slept.append(seconds)
        self.now += seconds
        self.on_sleep()
        return interrupt is not None and interrupt.is_set()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def rider(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> Rider:
    """A rider of its own on the fake clock, the one the S3 backend and the job runner use in the test (the
    process's keeps no outage of a test behind)."""
    fresh = Rider(clock)
    monkeypatch.setattr("probepo.store.s3.RIDER", fresh)
    monkeypatch.setattr("slurm.runner.RIDER", fresh)
    return fresh


def down_for(clock: FakeClock, seconds: float, cost_s: float = 0.0) -> tuple[Callable[[], str], list[float]]:
    """An operation that fails while the fake clock is within `seconds` of its first try, each try taking
    `cost_s` (botocore's own retries); returns it and the times of its tries."""
    tries: list[float] = []

    def operation() -> str:
        tries.append(clock.now)
        clock.now += cost_s
        if clock.now - tries[0] < seconds:
            raise StoreOutage(DOWN)
        return "answered"

    return operation, tries


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "probepo.store"]


def test_an_outage_shorter_than_the_deadline_is_waited_out_with_capped_backoff(rider, clock, caplog):
    operation, tries = down_for(clock, 120)
    with caplog.at_level(logging.WARNING), rider.configured(OutageBudget(600)):
        assert rider.ride_out(operation) == "answered"
    assert clock.slept == [1, 2, 4, 8, 16, 30, 30, 30]
    assert [t - tries[0] for t in tries] == [0, 1, 3, 7, 15, 31, 61, 91, 121]
    lines = said(caplog)
    assert len(lines) == 3  # as it starts, once a minute, as it ends
    assert lines[0].startswith("store unreachable since 2025-") and DOWN in lines[0]
    assert lines[1].startswith("store still unreachable since") and "(61 s)" in lines[1]
    assert lines[2].startswith("store answers again after 121 s")
    assert rider.patience_s == 0  # configured only within


def test_past_store_outage_s_the_same_error_says_since_when(rider, clock, caplog):
    operation, tries = down_for(clock, 10_000, cost_s=2.0)
    with rider.configured(OutageBudget(100)), pytest.raises(StoreOutage) as failed:
        rider.ride_out(operation)
    assert clock.now - tries[0] == 2 + 100 + 2  # seen after a try; the waits end at its deadline
    message = str(failed.value)
    assert message.startswith(DOWN + "; unreachable since 2025-")
    assert message.endswith("(102 s), past store_outage_s") and "\n" not in message


def test_the_jobs_time_limit_less_its_grace_ends_the_wait_first(rider, clock):
    operation, _ = down_for(clock, 10_000)
    with rider.configured(OutageBudget(600, time_left_s=40)), pytest.raises(StoreOutage) as failed:
        rider.ride_out(operation)
    assert sum(clock.slept) == 40 and clock.slept[-1] == 40 - 31  # the last wait cut to the limit
    assert str(failed.value).endswith("past the job's time limit less its signal grace")


def test_without_patience_the_first_failure_is_raised_as_it_was(rider, clock, caplog):
    error = StoreOutage(DOWN)

    def operation() -> None:
        raise error

    with caplog.at_level(logging.WARNING), pytest.raises(StoreOutage) as failed:
        rider.ride_out(operation)
    assert failed.value is error and clock.slept == [] and said(caplog) == []


def test_the_wait_is_counted_once_in_store_wait_however_many_waits_overlap(rider, clock):
    inner, _ = down_for(clock, 3)
    tries = []

    def outer() -> str:  # fails once, then waits on an inner operation that is down too
        tries.append(clock.now)
        if len(tries) == 1:
            raise StoreOutage(DOWN)
        return rider.ride_out(inner)

    with spend.attempt_spend() as counters, rider.configured(OutageBudget(600)):
        rider.ride_out(outer)
        stop = threading.Event()
        with rider.background(stop):  # a lease keeper's wait: no stage's
            rider.ride_out(down_for(clock, 5)[0])
    assert clock.now - tries[0] == 1 + 1 + 2 + 1 + 2 + 4
    assert counters.as_record()["seconds"] == {"store_wait": 4.0}  # 0 to 4, not 4 + 3


def test_a_wait_inside_a_timed_piece_leaves_the_pieces_adding_up():
    with spend.attempt_spend() as counters:
        started = time.perf_counter()
        with spend.timed("commit"):
            time.sleep(0.02)  # a commit that waited 15 ms of its 20 for the store
            spend.count_waited("store_wait", 0.015)
        elapsed = time.perf_counter() - started
    seconds = counters.as_record()["seconds"]
    assert seconds["store_wait"] == 0.015 and seconds["commit"] > 0
    assert seconds["commit"] + seconds["store_wait"] == pytest.approx(elapsed, abs=1e-3)


def test_a_background_wait_ends_when_its_thread_is_told_to_stop(rider, clock):
    stop = threading.Event()
    clock.on_sleep = stop.set
    with rider.configured(OutageBudget(600)), rider.background(stop), pytest.raises(StoreOutage) as failed:
        rider.ride_out(down_for(clock, 10_000)[0])
    assert clock.slept == [1] and str(failed.value).endswith("(1 s), its thread stops")


def test_the_lease_holders_fence_holds_the_runs_writes_until_a_renewal(rider, clock, caplog):
    fence = WriteFence("runs/r/", "runs/r/lease.json", until=clock.now + 10, holder="run r's driver d")
    current: list[WriteFence | None] = [fence]
    written: list[str] = []

    def write(key: str) -> None:
        rider.ride_out(lambda: written.append(key), key=key, fence=lambda: current[0])

    with caplog.at_level(logging.WARNING), rider.configured(OutageBudget(600)):
        write("runs/r/ledger/000001/sample.json")  # before the fence: at once
        clock.now += 10
        write("runs/r/lease.json")  # the lease's own write, conditional on its version
        write("runs/other/metrics.jsonl")  # another run's
        assert clock.slept == []

        def renewed_at_the_third_sleep() -> None:
            if len(clock.slept) == 3:
                current[0] = replace(fence, until=clock.now + 600)

        clock.on_sleep = renewed_at_the_third_sleep
        write("runs/r/ledger/000001/probe.json")  # waits at the fence until the third sleep renews
        assert clock.slept == [1, 2, 4]
        assert "run r's driver d: the lease was not renewed in time" in said(caplog)[0]
        lost = LeaseLost("lost the lease of run 'r'")
        current[0] = replace(fence, lost=lost)
        with pytest.raises(LeaseLost, match="lost the lease of run 'r'; refused to write"):
            write("runs/r/ledger/000001/score.json")
    assert written == [
        "runs/r/ledger/000001/sample.json",
        "runs/r/lease.json",
        "runs/other/metrics.jsonl",
        "runs/r/ledger/000001/probe.json",
    ]
    assert clock.slept == [1, 2, 4]  # a lost lease is not waited for


def test_a_waiting_process_says_it_goes_on_at_most_once_a_minute(rider, clock, caplog):
    with caplog.at_level(logging.WARNING), rider.configured(OutageBudget(5)):
        for _ in range(3):  # each read waits its 5 s, then the poll goes on without it

            def read() -> str:
                return rider.ride_out(down_for(clock, 10_000)[0])

            assert rider.unless_unreachable("following the run", read) == (False, None)
            clock.now += 30
    lines = [line for line in said(caplog) if line.endswith("following the run: tried again next time")]
    assert len(lines) == 2 and lines[0].startswith("store unreachable since 2025-")


def _client_error(status: int, code: str) -> ClientError:
    meta = {"HTTPStatusCode": status, "RetryAttempts": 2}
    return ClientError({"Error": {"Code": code, "Message": code}, "ResponseMetadata": meta}, "PutObject")


@pytest.mark.parametrize(
    ("failure", "outage"),
    [
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:1/b/k"), True),
        (ReadTimeoutError(endpoint_url="http://127.0.0.1:1/b/k"), True),
        (_client_error(503, "SlowDown"), True),
        (_client_error(500, "InternalError"), True),
        (_client_error(403, "AccessDenied"), False),
        (_client_error(404, "NoSuchBucket"), False),
        (_client_error(400, "InvalidArgument"), False),
    ],
)
def test_only_an_endpoint_that_does_not_answer_is_an_outage(failure: Exception, outage: bool):
    where = "S3 endpoint http://127.0.0.1:1, bucket 'b'"
    with pytest.raises(StoreError) as caught, translated_errors(where, "write", "k", https=False):
        raise failure
    assert isinstance(caught.value, StoreOutage) == outage
    assert str(caught.value).startswith(f"{where}: ")


def test_a_real_client_against_a_closed_port_waits_out_the_deadline(monkeypatch, rider, clock):
    aws = {**TEST_CREDENTIALS, "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}
    for variable, value in aws.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    store_sessions.cache_clear()
    endpoint = f"http://127.0.0.1:{free_port()}"
    with rider.configured(OutageBudget(10)):
        store = open_store("s3://bucket/p", endpoint_url=endpoint, max_attempts=0)  # one request a try
        with pytest.raises(StoreOutage) as failed:
            store.objects.put_bytes("runs/r/run.json", b"{}")
    store_sessions.cache_clear()
    assert clock.slept == [1, 2, 4, 3]
    message = str(failed.value)
    assert message.startswith(
        f"S3 endpoint {endpoint}, bucket 'bucket': cannot connect (EndpointConnectionError) while trying to"
        " write 'runs/r/run.json'; check that the endpoint is up"
    )
    assert message.endswith("past store_outage_s") and aws["AWS_SECRET_ACCESS_KEY"] not in message


# -- the job runner: the process that waits -----------------------------------------------------------

RUN = "outage-run"
PROFILE = ExecutionProfile(poll_s=0.001, poll_max_s=0.001, submit_retry_s=0, max_resubmits=2)


class Switchable:
    """A real local store's object layer behind a switch: while `down`, every operation raises StoreOutage
    as an S3 endpoint's does once the process has waited its store_outage_s."""

    def __init__(self, folder: Path) -> None:
        self._inner = open_store(folder).objects
        self.down = False
        self.failed = 0

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._inner, name)
        if not callable(found):
            return found

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                self.failed += 1
                raise StoreOutage(f"S3 endpoint fake: cannot connect while trying to {name}")
            return found(*args, **kwargs)

        return call


def _stage(store: ArtifactStore, tmp_path: Path, stop: Callable[[], bool] = lambda: False):
    ctx = StageContext(store, RUN, 3, RunConfig(), tmp_path, should_stop=stop)
    return StageRequest.of(ctx, Stage.SAMPLE), ctx


def test_the_runner_waits_out_an_unreachable_store_while_and_after_its_job_runs(tmp_path, rider, caplog):
    switch = Switchable(tmp_path / "store")
    watched = ArtifactStore(switch)  # type: ignore[arg-type]
    jobs_view = open_store(tmp_path / "store")  # the job's own connection, which the outage spares here
    backend = FakeBackend(jobs_view, [committing()])
    runner = JobRunner(backend, PROFILE)
    pauses: list[float] = []

    def pause(seconds: float, should_stop: Callable[[], bool]) -> None:
        pauses.append(seconds)
        switch.down = len(pauses) < 6  # back after 6 pauses: the job has ended by then

    runner.pause = pause
    followed: list[int] = []

    def follow() -> bool:  # what the CLI's follower of a resident job does at each poll
        followed.append(len(watched.read_metrics(RUN)))
        return False

    runner.on_poll = follow
    polls = backend.states

    def poll_then_cut(*args: Any) -> Any:
        switch.down = switch.down or not pauses  # the store goes away once the job is in flight
        return polls(*args)

    backend.states = poll_then_cut  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING):
        runner.run(*_stage(watched, tmp_path))
    assert runner.submissions == 1 and jobs_view.committed(RUN, 3, Stage.SAMPLE)
    [record] = jobs_view.jobs(RUN, 3, Stage.SAMPLE)
    assert (record["outcome"], record["state"]) == ("committed", "COMPLETED")
    # three polls saw the job (its state unrecorded, the follower failed), then its end waited 4 times
    assert followed == [] and switch.failed == 3 * 2 + 4 and len(pauses) == 6
    assert any(line.startswith("store unreachable since") for line in said(caplog))


def test_a_job_that_gave_up_on_the_store_is_submitted_again_naming_it(tmp_path, rider, caplog):
    store = open_store(tmp_path / "store")
    failed = {"job_id": "1001", "outcome": "failed", "error": f"StoreOutage: {DOWN}"}
    store.record_attempt(RUN, 3, Stage.SAMPLE, failed)  # the second job's, once the store answered again
    gave_up = job("RUNNING", Poll("FAILED", exit_code="69:0"))  # exited STORE_UNREACHABLE_EXIT
    failed_on_it = job("RUNNING", Poll("FAILED", exit_code="1:0"))
    runner = JobRunner(FakeBackend(store, [gave_up, failed_on_it, committing()]), PROFILE)
    with caplog.at_level(logging.WARNING):
        runner.run(*_stage(store, tmp_path))
    records = store.jobs(RUN, 3, Stage.SAMPLE)
    assert [(r["outcome"], r.get("cause")) for r in records] == [
        ("died", STORE_CAUSE),
        ("died", STORE_CAUSE),
        ("committed", None),
    ]
    lines = [r.getMessage() for r in caplog.records if STORE_CAUSE in r.getMessage()]
    assert len(lines) == 2
    assert "job 1000 ended FAILED (exit 69:0)" in lines[0] and "(death 1 in a row)" in lines[0]
    assert "job 1001 ended FAILED (exit 1:0)" in lines[1] and "(death 2 in a row)" in lines[1]

    more = [job("RUNNING", Poll("FAILED", exit_code="69:0")) for _ in range(PROFILE.max_resubmits + 1)]
    request, ctx = _stage(store, tmp_path)
    later = StageRequest(request.store_url, RUN, 4, Stage.SAMPLE, request.config_json)
    with pytest.raises(
        StageFailed, match="3 of them because the store stayed unreachable past store_outage_s"
    ):
        JobRunner(FakeBackend(store, more), PROFILE).run(later, ctx)


def test_a_driver_told_to_stop_while_the_store_is_unreachable_stops(tmp_path, rider):
    switch = Switchable(tmp_path / "store")
    switch.down = True
    stopping = [False]
    runner = JobRunner(FakeBackend(open_store(tmp_path / "store"), [committing()]), PROFILE)
    runner.pause = lambda seconds, should_stop: stopping.__setitem__(0, True)
    request, ctx = _stage(ArtifactStore(switch), tmp_path, stop=lambda: stopping[0])  # type: ignore[arg-type]
    with pytest.raises(DriverStopped, match="the store is unreachable"):
        runner.run(request, ctx)
    assert runner.submissions == 0  # nothing is submitted while the store cannot say what is in flight
