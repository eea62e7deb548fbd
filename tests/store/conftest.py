"""Store fixtures: a real S3-compatible endpoint (moto server, own process) and a store per backend."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import boto3
import pytest

from probepo.store import ArtifactStore, open_store
from tests.s3server import S3Server, isolated_aws_env, start_s3_server

BACKENDS = ["local", pytest.param("s3", marks=pytest.mark.integration)]


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One moto server for the session; boto3 in this process and its children points at it."""
    server = start_s3_server()
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
def s3_admin(s3_server: S3Server):
    """A plain boto3 client on the test endpoint, for setting up buckets."""
    return boto3.client("s3", endpoint_url=s3_server.endpoint_url)


@pytest.fixture
def s3_bucket(s3_admin) -> str:
    """A fresh, empty bucket on the test endpoint."""
    name = f"test-{uuid.uuid4().hex[:16]}"
    s3_admin.create_bucket(Bucket=name)
    return name


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """The URL of an empty store on each backend."""
    if request.param == "local":
        return str(tmp_path / "store")
    bucket = request.getfixturevalue("s3_bucket")
    return f"s3://{bucket}/prefix/under"


@pytest.fixture
def store(store_url: str) -> ArtifactStore:
    return open_store(store_url)
