"""The Prefect server of infra/prefect runs on its own PostgreSQL (infra/prefect/postgres.sh), not on
SQLite: it answers /api/health, and a flow the API creates is a row of the `prefect` database, which holds
Prefect's tables — read with psql over TCP, as the role `probepo` with the password of the state folder."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit
from uuid import uuid4

import pytest

from tests.flows import NEEDS_PREFECT

pytestmark = [
    pytest.mark.integration,
    NEEDS_PREFECT,
    pytest.mark.skipif(os.environ.get("PROBEPO_PREFECT_DB") == "sqlite", reason="PROBEPO_PREFECT_DB=sqlite"),
]

ROOT = Path(__file__).resolve().parents[2]


def _api(method: str, path: str, body: dict | None = None) -> object:
    request = urllib.request.Request(
        os.environ["PREFECT_API_URL"] + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json"},
    )
    auth = os.environ["PREFECT_API_AUTH_STRING"].encode()
    request.add_header("Authorization", "Basic " + base64.b64encode(auth).decode())
    with urllib.request.urlopen(request, timeout=30) as answer:
        text = answer.read()
    return json.loads(text) if text else None


def _psql(sql: str) -> str:
    """One query's rows (`|`-separated), on the database the server was given."""
    url = subprocess.run(["bash", str(ROOT / "infra" / "prefect" / "postgres.sh"), "url"],
                         capture_output=True, text=True, check=True, timeout=30).stdout.strip()  # fmt: skip
    parts = urlsplit(url)
    assert parts.scheme == "postgresql+asyncpg" and parts.hostname == "127.0.0.1", parts.scheme
    done = subprocess.run(
        ["psql", "-X", "-tA", "-v", "ON_ERROR_STOP=1", "-h", parts.hostname, "-p", str(parts.port),
         "-U", parts.username, "-d", parts.path.lstrip("/"), "-c", sql],
        env={**os.environ, "PGPASSWORD": parts.password or "", "PGCONNECT_TIMEOUT": "10"},
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_server_answers_its_health_check():
    assert _api("GET", "/health") is True


def test_the_server_keeps_its_flows_in_postgresql():
    tables = set(_psql("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").split())
    assert {"flow", "flow_run", "task_run", "deployment", "work_pool", "alembic_version"} <= tables
    name = f"probepo-server-test-{uuid4().hex[:8]}"
    flow = _api("POST", "/flows/", {"name": name})
    try:
        assert _psql(f"SELECT name FROM flow WHERE id = '{flow['id']}'") == name
    finally:
        _api("DELETE", f"/flows/{flow['id']}")
    assert _psql(f"SELECT count(*) FROM flow WHERE id = '{flow['id']}'") == "0"
