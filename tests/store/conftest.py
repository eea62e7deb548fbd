"""Store fixtures: an empty store on each backend (the S3 endpoint fixtures are in tests/conftest.py)."""

from __future__ import annotations

import pytest

from probepo.store import ArtifactStore, open_store

BACKENDS = ["local", pytest.param("s3", marks=pytest.mark.integration)]


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
