"""The capability probe: an S3 endpoint that ignores conditional requests is refused at the store's first
conditional write, naming the endpoint and what it lacks, before anything is written; one that honours
them is probed once and remembered."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator

import boto3
import pytest

from probepo.store import EndpointLacksConditionals, open_store
from probepo.store.capabilities import VERDICT, missing_conditionals
from probepo.store.local import LocalObjectStore
from tests.s3server import S3Server, isolated_aws_env, start_s3_server


@pytest.fixture(scope="module")
def ignoring_server() -> Iterator[S3Server]:
    server = start_s3_server(ignore_conditionals=True)
    yield server
    server.stop()


def _keys(s3_admin, bucket: str) -> list[str]:
    return [item["Key"] for item in s3_admin.list_objects_v2(Bucket=bucket).get("Contents", [])]


def test_an_honest_endpoint_is_probed_once_and_remembered(s3_bucket, s3_admin):
    store = open_store(f"s3://{s3_bucket}/lab")
    assert _keys(s3_admin, s3_bucket) == []  # opening contacts nothing
    store.create_run("r", {"seed": 0})  # a create-only write: probed first
    assert _keys(s3_admin, s3_bucket) == [f"lab/{VERDICT}", "lab/runs/r/run.json"]  # the probe's key is gone
    verdict = s3_admin.get_object(Bucket=s3_bucket, Key=f"lab/{VERDICT}")["LastModified"]
    open_store(f"s3://{s3_bucket}/lab").create_run("s", {"seed": 1})  # another process: reads the verdict
    assert s3_admin.get_object(Bucket=s3_bucket, Key=f"lab/{VERDICT}")["LastModified"] == verdict
    assert store.read_run("s") == {"seed": 1}


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
        "a DELETE with a stale If-Match was not refused",
    ]
    assert _keys(admin, bucket) == []  # nothing written: no verdict, no run
    with pytest.raises(EndpointLacksConditionals):  # and refused again, every time
        store.acquire_lease("r", "driver", ttl_s=60)


def test_the_probe_passes_a_local_folder():
    with tempfile.TemporaryDirectory() as folder:
        assert missing_conditionals(LocalObjectStore(folder)) == []
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
    assert failure.startswith(f"S3 endpoint {ignoring_server.endpoint_url}, store s3://{bucket}/lab/ cannot")
    assert "a create-only PUT (If-None-Match: *) of an existing key was not refused" in failure
    assert _keys(admin, bucket) == []
