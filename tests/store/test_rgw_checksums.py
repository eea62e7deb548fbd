"""Ceph RGW 16 over HTTPS refuses boto3's default uploads (the body aws-chunked with a trailing checksum,
which it does not know): the store says which setting to change, and with it works, multipart included.
Over plain HTTP boto3 signs the payload instead and the default works (the other store tests)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import boto3
import pytest

from probepo.store import StoreError, open_store
from probepo.store.s3 import MULTIPART_THRESHOLD
from probepo.store.s3 import _session as store_sessions

pytestmark = pytest.mark.integration


def test_over_https_rgw_16_needs_checksums_only_when_required(
    rgw_over_https: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bucket = f"test-{uuid.uuid4().hex[:16]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    with pytest.raises(StoreError, match="AWS_REQUEST_CHECKSUM_CALCULATION=when_required") as refused:
        open_store(f"s3://{bucket}/p").create_run("r", {"seed": 0})
    assert rgw_over_https in str(refused.value)

    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
    store_sessions.cache_clear()  # a session keeps the settings it first read
    store = open_store(f"s3://{bucket}/p")
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(MULTIPART_THRESHOLD + (1 << 20)))
    store.create_run("r", {"seed": 0})
    store.commit_stage("r", 0, "checkpoint", {"big.bin": big, "small": b"x" * 100})
    assert store.read_stage("r", 0, "checkpoint")["small"] == b"x" * 100
    assert store.download_stage_file("r", 0, "checkpoint", "big.bin", tmp_path / "out").read_bytes() == (
        big.read_bytes()
    )
