"""The capability probe: an S3 endpoint that ignores conditional requests is refused at the store's first
conditional write, naming the endpoint and what it lacks, before anything is written; one that honours
them is probed once and remembered, with its dialect (as measured: moto as AWS documents, Ceph RGW 16
with bare ETags in If-Match and no conditional DELETE, worked around)."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator

import boto3
import pytest

from probepo.checks.store import store_findings
from probepo.store import EndpointLacksConditionals, LeaseHeld, StoreError, open_store, read_lease
from probepo.store.capabilities import VERDICT, Conditionals, probe_conditionals
from probepo.store.keys import RunLayout
from probepo.store.local import LocalObjectStore
from tests.s3server import S3Server, isolated_aws_env, start_s3_server


@pytest.fixture(scope="module")
def ignoring_server() -> Iterator[S3Server]:
    server = start_s3_server(ignore_conditionals=True)
    yield server
    server.stop()


def _keys(s3_admin, bucket: str) -> list[str]:
    return [item["Key"] for item in s3_admin.list_objects_v2(Bucket=bucket).get("Contents", [])]


DIALECTS = {
    "moto": Conditionals(bare_if_match=False, conditional_delete=True),
    "rgw": Conditionals(bare_if_match=True, conditional_delete=False),
}
"""What each S3 implementation honours, as measured (docs/guides/cluster.md, "The store on S3", lists it)."""


def test_an_honest_endpoint_is_probed_once_and_remembered_with_its_dialect(
    endpoint_bucket, endpoint_admin, request
):
    dialect = DIALECTS[request.node.callspec.params["s3_endpoint"]]
    store = open_store(f"s3://{endpoint_bucket}/lab")
    assert _keys(endpoint_admin, endpoint_bucket) == []  # opening contacts nothing
    store.create_run("r", {"seed": 0})  # a create-only write: probed first
    keys = _keys(endpoint_admin, endpoint_bucket)
    assert keys == [f"lab/{VERDICT}", "lab/runs/r/run.json"]  # the probe's key is gone
    verdict = endpoint_admin.get_object(Bucket=endpoint_bucket, Key=f"lab/{VERDICT}")
    assert Conditionals.from_verdict(verdict["Body"].read()) == dialect
    later = open_store(f"s3://{endpoint_bucket}/lab")  # another process: reads the verdict, probes nothing
    later.create_run("s", {"seed": 1})
    assert (
        endpoint_admin.get_object(Bucket=endpoint_bucket, Key=f"lab/{VERDICT}")["LastModified"]
        == (verdict["LastModified"])
    )
    assert later.objects.honours_conditional_delete() is dialect.conditional_delete
    assert store.read_run("s") == {"seed": 1}
    assert probe_conditionals(later.objects) == (dialect, [])  # afresh, as `probepo check` runs it
    (passed,) = store_findings(f"s3://{endpoint_bucket}/lab").passed
    notes = "; ".join(dialect.workarounds())
    assert passed.endswith(f"conditional requests honoured ({notes})" if notes else "honoured")


def test_a_verdict_recorded_before_dialects_were_probed_reads_as_aws_documents():
    # Such a probe required the quoted If-Match and the conditional DELETE to pass.
    assert Conditionals.from_verdict(b'{"checked_at": "2026-12-01T00:00:00+00:00"}') == Conditionals()


def test_a_lease_is_released_and_a_marker_invalidated_without_a_conditional_delete_where_needed(
    endpoint_bucket, request
):
    dialect = DIALECTS[request.node.callspec.params["s3_endpoint"]]
    store = open_store(f"s3://{endpoint_bucket}/lab")
    lease = store.acquire_lease("r", "driver", ttl_s=60)
    stale = store.objects.get_versioned(RunLayout("r").lease)
    lease.renew()
    assert stale is not None and store.objects.put_if_match(RunLayout("r").lease, b"{}", stale.etag) is None
    lease.release()
    assert read_lease(store, "r") is None
    released = store.objects.get_versioned(RunLayout("r").lease)
    assert (released is None) is dialect.conditional_delete  # else a released record, read as no lease
    again = store.acquire_lease("r", "driver-2", ttl_s=60)
    assert again.replaced is None

    store.commit_stage("r", 0, "sample", {"a": b"1"})
    if dialect.conditional_delete:
        assert store.invalidate("r", 0, "sample", force=True)["forced"]  # a live driver does not matter
    else:
        with pytest.raises(LeaseHeld, match="driver-2"):  # invalidate needs the run's lease here
            store.invalidate("r", 0, "sample", force=True)
        assert store.committed("r", 0, "sample")
        with pytest.raises(StoreError, match="ignores If-Match on DELETE"):  # never sent unconditionally
            store.objects.delete_if_match(RunLayout("r").lease, released.etag if released else "")
        again.release()
        store.invalidate("r", 0, "sample", force=True)
        assert read_lease(store, "r") is None  # it took the lease and gave it back
    assert not store.committed("r", 0, "sample")


def test_an_endpoint_ignoring_conditionals_is_refused_naming_it(ignoring_server, s3_server):
    env = isolated_aws_env(ignoring_server)
    admin = boto3.client("s3", endpoint_url=ignoring_server.endpoint_url, region_name="us-east-1")
    bucket = f"test-{uuid.uuid4().hex[:16]}"
    admin.create_bucket(Bucket=bucket)
    store = open_store(f"s3://{bucket}/lab", endpoint_url=env["AWS_ENDPOINT_URL_S3"])
    with pytest.raises(EndpointLacksConditionals) as refused:
        store.create_run("r", {"seed": 0})
    message = str(refused.value)
    assert message.startswith(f"S3 endpoint {ignoring_server.endpoint_url}, store s3://{bucket}/lab/ cannot")
    assert refused.value.lacks == [
        "a create-only PUT (If-None-Match: *) of an existing key was not refused",
        "a PUT with a stale If-Match was not refused",
    ]
    assert _keys(admin, bucket) == []  # nothing written: no verdict, no run
    with pytest.raises(EndpointLacksConditionals):  # and refused again, every time
        store.acquire_lease("r", "driver", ttl_s=60)


def test_the_probe_passes_a_local_folder():
    with tempfile.TemporaryDirectory() as folder:
        assert probe_conditionals(LocalObjectStore(folder)) == (Conditionals(), [])
        left = os.listdir(os.path.join(folder, "capabilities"))
        assert [name for name in left if not name.startswith(".")] == []  # the local store's locks stay


def test_probepo_check_refuses_an_endpoint_ignoring_conditionals(ignoring_server, monkeypatch, tmp_path):
    from slurm.check import check_launch
    from tests.pipeline.conftest import tiny_config

    for name, value in isolated_aws_env(ignoring_server).items():
        monkeypatch.setenv(name, value)
    admin = boto3.client("s3", endpoint_url=ignoring_server.endpoint_url, region_name="us-east-1")
    bucket = f"test-{uuid.uuid4().hex[:16]}"
    admin.create_bucket(Bucket=bucket)
    recipe = tiny_config("probepo").model_dump(mode="json")
    found = check_launch(recipe, "inline", None, store=f"s3://{bucket}/lab").findings
    (failure,) = found.failures
    assert failure.startswith(f"store s3://{bucket}/lab: its endpoint does not honour conditional")
    assert "a create-only PUT (If-None-Match: *) of an existing key was not refused" in failure
    assert _keys(admin, bucket) == []
