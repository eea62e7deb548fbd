"""Store fixtures: an empty store on each backend (a local folder, and S3 on each implementation the store
is tested on: moto and Ceph RGW; their servers are the session fixtures of tests/conftest.py)."""

from __future__ import annotations

import os
import uuid

import boto3
import pytest

from probepo.store import ArtifactStore, open_store
from probepo.store.s3 import _session as store_sessions
from tests.s3server import S3Server, isolated_aws_env

S3_ENDPOINTS = [pytest.param(name, marks=pytest.mark.integration) for name in ("moto", "rgw")]
BACKENDS = ["local", *S3_ENDPOINTS]
_SERVER_FIXTURES = {"moto": "s3_server", "rgw": "rgw_server"}


def _use_endpoint(request: pytest.FixtureRequest, name: str) -> S3Server:
    """The S3 implementation `name`, with boto3 (in this process and in the test's child processes)
    pointed at it until the test ends. A boto3 session keeps the credentials it first read, and the store
    shares one per process: both are dropped, so that sessions made during the test read these."""
    server: S3Server = request.getfixturevalue(_SERVER_FIXTURES[name])
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    for variable, value in isolated_aws_env(server).items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    store_sessions.cache_clear()
    request.addfinalizer(store_sessions.cache_clear)
    return server


def _new_bucket(server: S3Server) -> str:
    name = f"test-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=server.endpoint_url).create_bucket(Bucket=name)
    return name


@pytest.fixture(params=S3_ENDPOINTS)
def s3_endpoint(request: pytest.FixtureRequest) -> S3Server:
    """Each S3 implementation in turn (moto, Ceph RGW), boto3 pointed at it for the test."""
    return _use_endpoint(request, request.param)


@pytest.fixture
def endpoint_bucket(s3_endpoint: S3Server) -> str:
    """A fresh, empty bucket on each S3 implementation."""
    return _new_bucket(s3_endpoint)


@pytest.fixture
def endpoint_admin(s3_endpoint: S3Server):
    """A plain boto3 client on each S3 implementation, for looking behind the store's back."""
    return boto3.client("s3", endpoint_url=s3_endpoint.endpoint_url)


@pytest.fixture
def rgw_over_https(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Ceph RGW's HTTPS endpoint (its self-signed certificate trusted), boto3 pointed at it for the test."""
    _use_endpoint(request, "rgw")
    endpoint = os.environ["PROBEPO_TEST_RGW_HTTPS_ENDPOINT"]
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    monkeypatch.setenv("AWS_CA_BUNDLE", os.environ["PROBEPO_TEST_RGW_CA_BUNDLE"])
    return endpoint


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """The URL of an empty store on each backend."""
    if request.param == "local":
        return str(tmp_path / "store")
    bucket = _new_bucket(_use_endpoint(request, request.param))
    return f"s3://{bucket}/prefix/under"


@pytest.fixture
def store(store_url: str) -> ArtifactStore:
    return open_store(store_url)
