"""A store outage on a real endpoint (moto and Ceph RGW, reached through a link the test cuts:
tests/store/cuttable_link.py): an operation started while the endpoint refuses connections completes once
it answers, nothing recomputed or lost, its wait counted as the attempt's `store_wait`; a conditional write
whose response an outage swallowed counts as ours; and a driver that cannot renew its lease writes nothing
once it could have expired: another driver takes the run over, the first one's writes raise LeaseLost, and
its marker of a stage the other committed is refused. Backoff and deadlines on a fake clock:
tests/unit/test_store_outage.py."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

from probepo import spend
from probepo.run.driver_lease import LeaseKeeper
from probepo.store import AlreadyCommitted, LeaseHeld, LeaseLost, acquire_lease, open_store, read_lease
from probepo.store.keys import new_attempt_id
from probepo.store.outage import OutageBudget, Rider
from tests.s3server import S3Server
from tests.store.cuttable_link import CuttableLink
from tests.store.faults import FaultInjector

pytestmark = pytest.mark.integration
RUN = "outage"
FILES = {"rollouts.parquet": b"r" * 5000, "meta.json": b"{}"}


@pytest.fixture
def rider(monkeypatch: pytest.MonkeyPatch) -> Iterator[Rider]:
    """A rider of the test's own (the process's keeps no outage of a test behind), waiting up to 60 s."""
    fresh = Rider()
    monkeypatch.setattr("probepo.store.s3.RIDER", fresh)
    monkeypatch.setattr("probepo.run.driver_lease.RIDER", fresh)
    with fresh.configured(OutageBudget(60)):
        yield fresh


@pytest.fixture
def link(s3_endpoint: S3Server) -> Iterator[CuttableLink]:
    cuttable = CuttableLink(s3_endpoint.endpoint_url)
    yield cuttable
    cuttable.down()


def _back_in(link: CuttableLink, seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, link.up)
    timer.start()
    return timer


def test_a_commit_started_while_the_endpoint_is_down_completes_when_it_answers(
    endpoint_bucket, link, rider, caplog
):
    # one request a try (no botocore backoff of its own): the outage is the rider's from the first one
    store = open_store(f"s3://{endpoint_bucket}/p", endpoint_url=link.endpoint_url, max_attempts=0)
    link.down()
    _back_in(link, 3.0)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING), spend.attempt_spend() as counters:
        marker = store.commit_stage(RUN, 0, "sample", FILES)
    took = time.monotonic() - started
    direct = open_store(f"s3://{endpoint_bucket}/p")
    assert direct.marker(RUN, 0, "sample") == marker
    assert {name: direct.read_stage(RUN, 0, "sample")[name] for name in FILES} == FILES
    waited = counters.as_record()["seconds"]["store_wait"]
    assert 2.5 < waited <= took
    said = [r.getMessage() for r in caplog.records if r.name == "probepo.store"]
    assert said[0].startswith("store unreachable since") and "cannot connect" in said[0]
    assert said[-1].startswith("store answers again after")


def test_a_conditional_write_whose_response_was_lost_counts_as_ours(endpoint_bucket, rider):
    # one request a try: the marker lands, its response is lost, and the rider (not botocore) sends it again
    store = open_store(f"s3://{endpoint_bucket}/p", max_attempts=0)
    lost = FaultInjector(["lost"], period=1, operations=("PutObject",), url_contains="/ledger/", limit=1)
    lost.install(store.objects.client)
    marker = store.commit_stage(RUN, 0, "sample", FILES)
    assert lost.injected == [("PutObject", "lost")]
    assert open_store(f"s3://{endpoint_bucket}/p").marker(RUN, 0, "sample") == marker


def _taken_over(bucket: str, ttl_s: float) -> None:
    """Another driver (its own connection, which the outage spares) takes the run once its lease expired."""
    other = open_store(f"s3://{bucket}/p")
    deadline = time.monotonic() + 4 * ttl_s
    while True:
        try:
            acquire_lease(other, RUN, "second-driver", ttl_s=60)
            return
        except LeaseHeld:
            assert time.monotonic() < deadline, "the first driver's lease never expired"
            time.sleep(0.2)


def test_a_driver_that_cannot_renew_writes_nothing_once_its_lease_could_have_expired(
    endpoint_bucket, link, rider, caplog
):
    ttl_s = 4.0
    first = open_store(f"s3://{endpoint_bucket}/p", endpoint_url=link.endpoint_url)
    first.create_run(RUN, {"recipe": 1})
    lease = acquire_lease(first, RUN, "first-driver", ttl_s)
    with caplog.at_level(logging.WARNING), LeaseKeeper(lease) as keeper:
        link.down()  # the first driver's store goes away
        _taken_over(endpoint_bucket, ttl_s)
        second = open_store(f"s3://{endpoint_bucket}/p")
        winner = second.commit_stage(RUN, 0, "sample", FILES)
        link.up()
        # its next write waits at the fence until a renewal finds the lease taken, then refuses to go out
        with pytest.raises(LeaseLost, match="refused to write"):
            first.commit_stage(RUN, 0, "probe", {"probes.parquet": b"p"})
        with pytest.raises(LeaseLost):
            keeper.check()  # the driver's next stage boundary stops it too
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "could not renew the lease" in said and "writes nothing of the run" in said
    assert read_lease(second, RUN)["holder"] == "second-driver"
    assert not second.committed(RUN, 0, "probe")
    # Its keeper gone, the first driver's marker of the stage the second committed is refused by the
    # create-only write itself: the second's commit is the truth.
    attempt = new_attempt_id()
    uploaded = first.upload_attempt_files(RUN, 0, "sample", attempt, {"rollouts.parquet": b"stale"})
    with pytest.raises(AlreadyCommitted):
        first.finish_commit(RUN, 0, "sample", attempt, uploaded)
    assert second.marker(RUN, 0, "sample") == winner
