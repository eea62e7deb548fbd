"""Transient S3 failures (503 SlowDown, 500, connection resets, lost responses, bodies cut mid-stream)
are retried and nothing is lost, on each S3 implementation (moto, Ceph RGW: the faults are injected in
the client, through botocore's hooks); an unreachable endpoint gives a clear error without the secret."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from probepo.store import ArtifactStore, StoreError, StoreUnreachable, open_store, read_lease
from probepo.store.s3 import MULTIPART_THRESHOLD
from tests.s3server import TEST_CREDENTIALS, free_port
from tests.store.faults import BodyBreaker, FaultInjector

pytestmark = pytest.mark.integration
RUN = "faulty"


@pytest.fixture
def s3_store(endpoint_bucket: str) -> ArtifactStore:
    return open_store(f"s3://{endpoint_bucket}/p")


def test_transient_failures_on_every_operation_are_retried_and_nothing_is_lost(
    endpoint_bucket: str, tmp_path: Path
) -> None:
    writer = open_store(f"s3://{endpoint_bucket}/p")
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(MULTIPART_THRESHOLD + (5 << 20)))  # multipart: several UploadPart calls
    client = writer.objects.client
    faults = FaultInjector(["500", "reset"], period=3, limit=6).install(client)
    multipart = FaultInjector(["reset", "500"], period=1, operations=("UploadPart",), limit=2).install(client)
    # One SlowDown, on the last write: botocore's adaptive mode then throttles this client for seconds.
    slow_down = FaultInjector(["503"], period=1, operations=("PutObject",), url_contains="/ledger/", limit=1)
    slow_down.install(client)
    writer.append_metrics(RUN, {"update": 0})
    with writer.acquire_lease(RUN, "driver", ttl_s=60) as lease:
        lease.renew()
    files = {f"small-{i}": f"payload {i}".encode() for i in range(6)} | {"big.bin": big}
    marker = writer.commit_stage(RUN, 0, "optimize", files, summary={"loss": 1.5})
    assert {fault for _, fault in faults.injected} == {"500", "reset"}
    assert multipart.injected == [("UploadPart", "reset"), ("UploadPart", "500")]
    assert slow_down.injected == [("PutObject", "503")]

    reader = open_store(f"s3://{endpoint_bucket}/p")
    read_faults = FaultInjector(["500", "reset"], period=2, limit=6).install(reader.objects.client)
    files_read = reader.read_stage(RUN, 0, "optimize")
    assert all(files_read[name] == files[name] for name in files if name != "big.bin")
    out = reader.download_stage_file(RUN, 0, "optimize", "big.bin", tmp_path / "out.bin")
    assert out.read_bytes() == big.read_bytes()
    assert reader.marker(RUN, 0, "optimize") == marker
    assert reader.read_metrics(RUN) == [{"update": 0}]
    assert reader.stage_problems(RUN, 0, "optimize")[0] == []
    assert len(read_faults.injected) == 6 and "GetObject" in {op for op, _ in read_faults.injected}


def test_a_multipart_upload_that_fails_is_aborted_and_nothing_is_committed(
    endpoint_bucket: str, endpoint_admin, tmp_path: Path
) -> None:
    store = open_store(f"s3://{endpoint_bucket}/p", max_attempts=2)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(MULTIPART_THRESHOLD + (5 << 20)))
    failing = FaultInjector(["500"], period=1, operations=("UploadPart",)).install(store.objects.client)
    with pytest.raises(StoreError, match="upload"):
        store.commit_stage(RUN, 0, "checkpoint", {"big.bin": big})
    assert failing.injected
    assert endpoint_admin.list_multipart_uploads(Bucket=endpoint_bucket).get("Uploads", []) == []
    assert store.marker(RUN, 0, "checkpoint") is None
    assert [info.key for info in store.objects.list("")] == []


def test_lost_response_of_the_marker_write_still_counts_as_our_commit(s3_store: ArtifactStore) -> None:
    # The create-only PUT lands, its response is lost, botocore retries and gets 412: it was our own write.
    injector = FaultInjector(["lost"], period=1, operations=("PutObject",), url_contains="/ledger/", limit=1)
    injector.install(s3_store.objects.client)
    marker = s3_store.commit_stage(RUN, 0, "sample", {"a": b"data"})
    assert injector.injected == [("PutObject", "lost")]
    assert s3_store.marker(RUN, 0, "sample") == marker


def test_lost_response_of_a_lease_renewal_still_renews(s3_store: ArtifactStore) -> None:
    lease = s3_store.acquire_lease(RUN, "driver", ttl_s=60)
    injector = FaultInjector(["lost"], period=1, operations=("PutObject",), limit=1)
    injector.install(s3_store.objects.client)
    lease.renew()
    assert injector.injected == [("PutObject", "lost")]
    lease.renew()  # the ETag we kept is the live one
    lease.release()
    assert read_lease(s3_store, RUN) is None


def test_body_cut_mid_stream_is_retried(s3_store: ArtifactStore) -> None:
    s3_store.commit_stage(RUN, 0, "sample", {"a": b"x" * 1000})
    breaker = BodyBreaker(count=2).install(s3_store.objects.client)
    assert s3_store.read_stage(RUN, 0, "sample")["a"] == b"x" * 1000
    assert breaker.broken == 2


def test_unreachable_endpoint_names_endpoint_and_bucket_but_never_the_secret() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    store = open_store("s3://some-bucket/p", endpoint_url=endpoint, max_attempts=1)
    with pytest.raises(StoreUnreachable) as caught:
        store.read_stage(RUN, 0, "sample")
    message = str(caught.value)
    assert endpoint in message and "some-bucket" in message
    assert TEST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in message
    assert caught.value.__cause__ is None


def test_missing_bucket_is_reported_as_unreachable(s3_endpoint) -> None:
    store = open_store("s3://no-such-bucket-here/p")
    with pytest.raises(StoreUnreachable, match="bucket does not exist"):
        store.commit_stage(RUN, 0, "sample", {"a": b"1"})
