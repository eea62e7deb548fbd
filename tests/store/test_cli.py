"""`probepo store ls|verify|gc`: output, exit codes, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from probepo.cli import app
from probepo.store import open_store
from probepo.store.keys import RunLayout

runner = CliRunner()


@pytest.fixture
def populated(tmp_path: Path) -> str:
    url = str(tmp_path / "store")
    store = open_store(url)
    store.create_run("demo", {"code_version": "0.1.0"})
    store.commit_stage("demo", 0, "sample", {"a": b"1234"})
    store.commit_stage("demo", 0, "checkpoint", {"w": b"weights"})
    store.objects.put_bytes(RunLayout("demo").data_key(0, "score", "20200101T000000Z-dead", "x"), b"orphan")
    return url


def test_ls_lists_runs_and_a_run_summary(populated: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROBEPO_STORE", populated)
    assert runner.invoke(app, ["store", "ls"]).output.split() == ["demo"]
    result = runner.invoke(app, ["store", "ls", "demo"])
    assert result.exit_code == 0, result.output
    assert "latest checkpoint: update 0" in result.output and "checkpoint, sample" in result.output


def test_verify_exits_1_on_corruption(populated: str) -> None:
    result = runner.invoke(app, ["store", "verify", "demo", "--store", populated])
    assert result.exit_code == 0 and "0 problem(s)" in result.output
    store = open_store(populated)
    marker = store.marker("demo", 0, "sample")
    assert marker is not None
    store.objects.put_bytes(RunLayout("demo").data_key(0, "sample", marker["attempt"], "a"), b"1235")
    result = runner.invoke(app, ["store", "verify", "demo", "--store", populated])
    assert result.exit_code == 1 and "'sample' file 'a'" in result.output


def test_gc_dry_run_then_gc(populated: str) -> None:
    args = ["store", "gc", "demo", "--store", populated, "--min-age", "0"]
    dry = runner.invoke(app, [*args, "--dry-run"])
    assert dry.exit_code == 0 and "would remove updates/000000/score/20200101T000000Z-dead/" in dry.output
    done = runner.invoke(app, args)
    assert done.exit_code == 0 and "removed 1 orphaned attempt(s)" in done.output
    assert open_store(populated).read_stage("demo", 0, "sample")["a"] == b"1234"


def test_gc_refuses_while_a_driver_holds_the_lease(populated: str) -> None:
    open_store(populated).acquire_lease("demo", "driver@node7", ttl_s=60)
    result = runner.invoke(app, ["store", "gc", "demo", "--store", populated])
    assert result.exit_code == 2 and "driver@node7" in result.output


def test_store_errors_are_one_line_with_exit_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["store", "verify", "nope", "--store", str(tmp_path / "empty")])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "run 'nope' not found" in result.output
    assert "Traceback" not in result.output
