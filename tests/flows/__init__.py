"""Tests of the flows against a real Prefect server and worker (infra/prefect; scripts/test starts them)."""

import os

import pytest

NEEDS_PREFECT = pytest.mark.skipif(
    not os.environ.get("PREFECT_API_URL"),
    reason="needs the Prefect server and worker of infra/prefect (PREFECT_API_URL; scripts/test starts them)",
)
