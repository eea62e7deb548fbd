"""`probepo store ls|verify|gc`: output, exit codes, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from probepo.cli import app
from probepo.store import open_store
from probepo.store.cli import store_url
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


@pytest.fixture
def site(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A site file named by $PROBEPO_SITE (its content is each test's), and no $PROBEPO_STORE."""
    monkeypatch.delenv("PROBEPO_STORE", raising=False)
    path = tmp_path / "site.yaml"
    monkeypatch.setenv("PROBEPO_SITE", str(path))
    return path


def test_the_site_files_store_comes_after_the_option_and_the_environment_before_the_recipes(
    populated: str, site: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    site.write_text(f"store: {populated}\n")
    assert store_url(None, "./recipe-store") == populated  # a run the UI launched is where resume looks
    assert runner.invoke(app, ["store", "ls"]).output.split() == ["demo"]
    elsewhere = str(tmp_path / "elsewhere")
    assert store_url(elsewhere) == elsewhere
    monkeypatch.setenv("PROBEPO_STORE", elsewhere)
    assert store_url(None, "./recipe-store") == elsewhere
    monkeypatch.delenv("PROBEPO_STORE")
    site.write_text("store: runs\n")  # a folder, as the site's other paths: from the site file's folder
    assert store_url(None) == str(site.parent / "runs")
    site.write_text("executor: local\n")  # a site without a store leaves each recipe its own
    assert store_url(None, "./recipe-store") == "./recipe-store"


def test_a_site_file_that_does_not_read_is_one_error_line_naming_it(site: Path) -> None:
    site.write_text("stor: s3://team/probepo\n")
    refusal = f"error: {site}: stor: no such field; did you mean store?"
    result = runner.invoke(app, ["store", "ls"])
    assert (result.exit_code, result.output.strip().splitlines()) == (2, [refusal])
    train = ["train", "configs/cpu-demo.yaml", "--run-id", "x"]
    for command in (["jobs", "demo"], ["resume", "demo"], train):
        result = runner.invoke(app, command)
        assert (result.exit_code, result.output.splitlines()[-1]) == (2, refusal)
