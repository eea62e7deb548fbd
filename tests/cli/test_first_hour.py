"""The first hour of a new user, through the real command line (a subprocess, as a user types it): one-line
errors whose advice names options that exist, status lines after the checks, `store ls` that says where a
run stands, extending a finished run, and honest demo gains."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from probepo.run.faults import CRASH_ENV
from probepo.store import ArtifactStore
from probepo.store.formats import to_json_bytes
from probepo.store.keys import RunLayout
from tests.pipeline.conftest import tiny_config

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def probepo(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    """`probepo ARGS` in a fresh process; returns the CompletedProcess (text)."""
    return subprocess.run(
        [sys.executable, "-m", "probepo.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The command failed with exit 2 and exactly one `error:` line and no traceback; returns it."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    return errors[0]


@pytest.fixture(scope="module")
def preset(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("presets") / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config("grpo").model_dump(mode="json")))
    return path


@pytest.fixture(scope="module")
def finished(warm_store: ArtifactStore, preset: Path, tmp_path_factory) -> str:
    """A run of the tiny preset trained to the end through the command line."""
    events = tmp_path_factory.mktemp("events")
    result = probepo(
        "train", str(preset), "--run-id", "hour", "--store", warm_store.url, "--tensorboard", str(events)
    )
    assert result.returncode == 0, result.stderr
    return "hour"


def test_a_store_that_cannot_be_is_one_line_naming_it(tmp_path, preset):
    (tmp_path / "afile").write_text("not a folder")
    bad = str(tmp_path / "afile" / "store")
    for args in (("store", "ls", "--store", bad), ("train", str(preset), "--run-id", "x", "--store", bad)):
        line = one_error_line(probepo(*args))
        assert bad in line and "is a file, not a folder" in line and "--store" in line
    # S3: an endpoint nobody answers on.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = {
        "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}",
        "AWS_MAX_ATTEMPTS": "1",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    line = one_error_line(probepo("store", "ls", "--store", "s3://nowhere/runs", env=dead))
    assert "cannot connect" in line and "AWS_ENDPOINT_URL_S3" in line


def test_an_empty_store_says_so(tmp_path):
    result = probepo("store", "ls", "--store", str(tmp_path / "new"))
    assert result.returncode == 0 and "holds no runs" in result.stdout


def test_a_live_holder_is_named_with_advice_that_exists(warm_store, preset, finished):
    warm_store.acquire_lease(finished, "driver@node7", ttl_s=60)
    try:
        for args in (
            ("train", str(preset), "--run-id", finished, "--store", warm_store.url),
            ("resume", finished, "--store", warm_store.url),
        ):
            result = probepo(*args)
            line = one_error_line(result)
            assert "driver@node7" in line and "--take-over" in line and "--force" not in line
            assert "resuming" not in result.stdout and "complete" not in result.stdout  # no status first
            assert "--take-over" in probepo(args[0], "--help").stdout
        gc = one_error_line(probepo("store", "gc", finished, "--store", warm_store.url))
        assert (
            "driver@node7" in gc and "--force" in gc and "--force" in probepo("store", "gc", "--help").stdout
        )
    finally:
        warm_store.objects.delete(RunLayout(finished).lease)


def _plant_dead_lease(store: ArtifactStore, run_id: str) -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    record = {
        "holder": f"{socket.gethostname()}:{child.pid}",
        "host": socket.gethostname(),
        "pid": child.pid,
        "ttl_s": 600.0,
        "expires_at": "later",
        "expires_at_epoch": time.time() + 600,
    }
    store.objects.put_bytes(RunLayout(run_id).lease, to_json_bytes(record))


def test_gc_takes_over_a_dead_drivers_lease_like_resume_and_speaks_in_hours(warm_store, finished):
    _plant_dead_lease(warm_store, finished)
    result = probepo("store", "gc", finished, "--store", warm_store.url)
    assert result.returncode == 0, result.stderr
    layout = RunLayout(finished)
    warm_store.objects.put_bytes(layout.data_key(0, "score", "20991231T000000000000Z-young", "x"), b"orphan")
    result = probepo("store", "gc", finished, "--store", warm_store.url)
    assert result.returncode == 0 and "kept 1 younger than 6.0 h (--min-age)" in result.stdout
    assert "--min-age" in probepo("store", "gc", "--help").stdout


def test_bad_values_blame_the_option_and_say_what_is_allowed(tmp_path, preset):
    line = one_error_line(probepo("train", str(preset), "--run-id", "x", "--set", "algo.kappa=abc"))
    assert line.startswith("error: --set algo.kappa:") and "'abc'" in line and "a number >= 0" in line
    result = probepo("train", str(preset), "--run-id", "x", "--set", "group_sze=3")
    assert "--set group_sze: no such field; did you mean group_size?" in one_error_line(result)
    typo = tmp_path / "typo.yaml"
    typo.write_text("algo:\n  kapa: 3\n")
    assert f"{typo}: algo.kapa: no such field; did you mean algo.kappa?" in one_error_line(
        probepo("train", str(typo), "--run-id", "x")
    )
    line = one_error_line(probepo("train", str(preset), "--run-id", "x", "--algo", "ppo"))
    assert line.startswith("error: --algo:") and "'grpo', 'probepo', 'vineppo'" in line


def test_help_has_no_bool_metavars_and_names_the_presets_store():
    for command in (("train",), ("resume",), ("store", "gc"), ("store", "invalidate")):
        text = probepo(*command, "--help").stdout
        assert "<bool>" not in text and "--help" in text
    assert "preset's `store`" in " ".join(probepo("train", "--help").stdout.split())


def test_updates_wins_over_set_num_updates_and_says_so(warm_store, preset, tmp_path):
    result = probepo(
        "train", str(preset), "--run-id", "wins", "--store", warm_store.url, "--quiet",
        "--set", "num_updates=0", "--updates", "1", "--tensorboard", str(tmp_path / "tb"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "note: --updates 1 wins over --set num_updates=0" in result.stderr
    assert "1 updates" in result.stdout


def test_rloo_trains_from_the_command_line(warm_store, preset, tmp_path):
    result = probepo(
        "train", str(preset), "--run-id", "rloo", "--store", warm_store.url, "--quiet",
        "--algo", "rloo", "--updates", "1", "--tensorboard", str(tmp_path / "tb"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert warm_store.read_run("rloo")["config"]["algo"]["algorithm"] == "rloo"
    assert warm_store.marker("rloo", 0, "advantage")["summary"]["residual_abs_mean"] == 0.0


def test_first_train_says_where_things_are_then_resume_skips_quietly(warm_store, preset, tmp_path):
    events = tmp_path / "tb"
    args = ["--store", warm_store.url, "--tensorboard", str(events)]
    first = probepo("train", str(preset), "--run-id", "where", *args)
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert lines[0].startswith("warm-up: warmup-") and "reused" in lines[0]
    assert f"store: {warm_store.url}" in lines and "starting run where: 2 updates" in first.stdout
    assert f"TensorBoard events: {events}" in first.stdout
    assert lines[-1].startswith(f"store: {warm_store.url}; TensorBoard events: {events}")
    files = sorted(events.iterdir())
    again = probepo("resume", "where", *args)
    assert again.returncode == 0, again.stderr
    assert "run where is complete" in again.stdout
    assert "update    " not in again.stdout and "skipped" not in again.stdout  # nothing re-printed
    assert sorted(events.iterdir()) == files  # a no-op resume writes no empty event file


def test_store_ls_says_where_a_killed_run_resumes_and_marks_the_dead(warm_store, preset, tmp_path):
    args = ["--store", warm_store.url, "--quiet", "--tensorboard", str(tmp_path / "tb")]
    killed = probepo(
        "train", str(preset), "--run-id", "killed", *args, env={CRASH_ENV: "1:probe:before-commit"}
    )
    assert killed.returncode == -signal.SIGKILL
    ls = probepo("store", "ls", "killed", "--store", warm_store.url).stdout
    assert "status: resumes at update 1, stage probe" in ls
    assert "1 dead" in ls and "job None" not in ls and "partial" not in ls
    assert "its process is gone" in ls  # the dead driver's lease, which the next resume takes over
    resumed = probepo("resume", "killed", *args[:-3], "--tensorboard", str(tmp_path / "tb"))
    assert resumed.returncode == 0, resumed.stderr
    # One line for what the resume skips, then the stages it runs; nothing of update 0 is re-printed.
    assert (
        "skipped 4 committed stage(s) of update 1" in resumed.stdout and "update    0" not in resumed.stdout
    )
    assert "update    1 probe" in resumed.stdout
    ls = probepo("store", "ls", "killed", "--store", warm_store.url).stdout
    assert "status: complete" in ls and "1 dead" in ls and "running" not in ls
    assert "in flight" not in ls  # the optimizer's committed parts are not news once it committed


def test_extending_a_finished_run(warm_store, preset, finished, tmp_path):
    before = {u: warm_store.read_stage(finished, u, "checkpoint")["model.safetensors"] for u in (1, 2)}
    refused = one_error_line(
        probepo("train", str(preset), "--run-id", finished, "--updates", "3", "--store", warm_store.url)
    )
    assert f"probepo resume {finished} --updates N" in refused
    shorter = one_error_line(probepo("resume", finished, "--updates", "1", "--store", warm_store.url))
    assert "never shortened" in shorter
    args = ["--store", warm_store.url, "--quiet", "--tensorboard", str(tmp_path / "tb")]
    result = probepo("resume", finished, "--updates", "3", *args)
    assert result.returncode == 0, result.stderr
    assert f"run {finished}: extended from 2 to 3 updates" in result.stdout
    assert warm_store.committed(finished, 3, "checkpoint")
    assert {
        u: warm_store.read_stage(finished, u, "checkpoint")["model.safetensors"] for u in (1, 2)
    } == before
    ls = probepo("store", "ls", finished, "--store", warm_store.url).stdout
    assert "3 updates, extended from 2 to 3 at" in ls and "status: complete" in ls
    report = probepo("report", finished, "--store", warm_store.url, "--out", str(tmp_path / "report"))
    assert f"{finished} was extended from 2 to 3 updates" in report.stdout
    metrics = warm_store.read_metrics(finished)
    assert sorted({m["update"] for m in metrics if "sample/reward_mean" in m}) == [0, 1, 2]


def test_demo_gains_carry_their_standard_error(warm_store, preset, tmp_path):
    # README's first command as written (`bash scripts/demo`: the venv checked, then `probepo demo`), on the
    # tiny preset and the warm store so that it takes seconds, not minutes
    options = ["--config", str(preset), "--store", warm_store.url, "--out", str(tmp_path / "demo")]
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "demo"), *options], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "gain ± s.e." in text and text.count(" ± ") >= 2
    assert "within noise" in text or "more than two standard errors" in text
    assert "both arms learn" not in text


def test_train_runs_the_checks_first_and_no_check_says_it_skips_them(tmp_path, preset):
    (tmp_path / "afile").write_text("not a folder")
    bad = str(tmp_path / "afile" / "store")
    line = one_error_line(probepo("train", str(preset), "--run-id", "x", "--store", bad))
    assert line.startswith("error: refused: ") and "--no-check skips them" in line
    skipped = probepo("train", str(preset), "--run-id", "x", "--store", bad, "--no-check")
    line = one_error_line(skipped)  # the store's own error, met when the run opens it
    assert "checks skipped (--no-check)" in skipped.stderr and "refused" not in line and bad in line


def test_resume_runs_the_checks_first_and_no_check_says_it_skips_them(warm_store, finished, tmp_path):
    """A job folder the local executor cannot write: the checks refuse the resume; --no-check skips them
    and says so, and the finished run needs no job."""
    (tmp_path / "afile").write_text("not a folder")
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump({"job_folder": str(tmp_path / "afile" / "jobs")}))
    args = ["resume", finished, "--store", warm_store.url, "--executor", "local", "--profile", str(profile)]
    args += ["--tensorboard", str(tmp_path / "tb")]
    line = one_error_line(probepo(*args))
    assert line.startswith(f"error: refused: job_folder = {tmp_path / 'afile' / 'jobs'}: not writable")
    assert line.endswith("`probepo check` lists every finding, --no-check skips them")
    skipped = probepo(*args, "--no-check")
    assert skipped.returncode == 0, skipped.stderr
    assert "checks skipped (--no-check)" in skipped.stderr and f"run {finished} is complete" in skipped.stdout


def test_check_takes_the_executor_a_run_would_and_says_which(tmp_path):
    """The testbed on a machine without SLURM (no sbatch on PATH) passes (inline, its default), and a site
    file's executor is the default where there is one."""
    no_slurm = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "PROBEPO_SITE"))}
    no_slurm["PATH"] = str(tmp_path / "no-bin")  # python is started by its full path
    command = [
        sys.executable,
        "-m",
        "probepo.cli",
        "check",
        "configs/cpu-demo.yaml",
        "--store",
        str(tmp_path),
    ]
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(command, capture_output=True, text=True, env=no_slurm, cwd=root, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("executor: inline (the testbed runs in this process")
    site = tmp_path / "site.yaml"
    site.write_text("executor: local\n")
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={**no_slurm, "PROBEPO_SITE": str(site)},
        cwd=root,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.startswith(f"executor: local (the site's, {site}")
