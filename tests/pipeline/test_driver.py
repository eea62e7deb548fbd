"""The driver's guards: one driver per run, preemption at a safe point, clear errors on bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from probepo.presets import with_overrides
from probepo.run.driver_lease import LeaseKeeper
from probepo.run.faults import PAUSE_ENV, PAUSE_MARK_ENV
from probepo.run.pipeline import train
from probepo.run.preemption import PREEMPTED_EXIT, Preempted
from probepo.store import ArtifactStore, LeaseHeld, LeaseLost, RunConfigMismatch, acquire_lease
from probepo.store.formats import to_json_bytes
from probepo.store.keys import RunLayout
from tests.pipeline.conftest import tiny_config


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "probepo.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_second_driver_is_refused_with_the_holders_name(warm_store: ArtifactStore):
    config = tiny_config("grpo", num_updates=1)
    warm_store.create_run(
        "guarded", {"config": config.model_dump(mode="json", exclude={"store"}), "code_version": "0.1.0"}
    )
    with (
        warm_store.acquire_lease("guarded", "other-driver@node7", ttl_s=60),
        pytest.raises(LeaseHeld, match="other-driver@node7"),
    ):
        # The holder is alive (a live lease of another host or process): never taken over.
        train(config, "guarded", store=warm_store)


def test_resume_with_another_recipe_is_refused(warm_store: ArtifactStore):
    train(tiny_config("grpo", num_updates=0), "frozen", store=warm_store)
    with pytest.raises(RunConfigMismatch, match=r"differing: config\.algo\.algorithm\)"):
        train(tiny_config("probepo", num_updates=0), "frozen", store=warm_store)


PAUSED_IN_OPTIMIZE = "0:optimize.minibatch-0000:done"  # the safe point after the first mini-batch


def _wait_for_mark(mark: Path, process: subprocess.Popen | None = None) -> int:
    """The pid a paused stage wrote to `mark`, once it is there."""
    deadline = time.monotonic() + 120
    while not mark.exists() or not mark.read_text().strip():
        assert process is None or process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the stage never reached its pause point"
        time.sleep(0.05)
    return int(mark.read_text().split()[0])


def test_a_real_sigusr2_commits_the_minibatch_then_raises_preempted(warm_store, monkeypatch, tmp_path):
    mark = tmp_path / "paused"
    monkeypatch.setenv(PAUSE_ENV, PAUSED_IN_OPTIMIZE)
    monkeypatch.setenv(PAUSE_MARK_ENV, str(mark))
    config = tiny_config("grpo", num_updates=1)

    def preempt() -> None:
        os.kill(_wait_for_mark(mark), signal.SIGUSR2)  # as SLURM does, to this very process

    sender = threading.Thread(target=preempt, daemon=True)
    sender.start()
    with pytest.raises(Preempted, match="mini-batch 0 of update 0"):
        train(config, "preempted", store=warm_store)
    sender.join()
    assert warm_store.committed("preempted", 0, "optimize.part-0000")
    assert not warm_store.committed("preempted", 0, "optimize")
    monkeypatch.delenv(PAUSE_ENV)
    train(config, "preempted", store=warm_store)
    assert warm_store.committed("preempted", 0, "optimize")
    outcomes = [a["outcome"] for a in warm_store.attempts("preempted", 0, "optimize")]
    assert outcomes == ["preempted", "committed"]


@pytest.mark.integration
@pytest.mark.parametrize("signum", [signal.SIGUSR2, signal.SIGTERM], ids=["SIGUSR2", "SIGTERM"])
def test_a_preempted_cli_run_commits_and_exits_75(warm_store, tmp_path, signum):
    preset = tmp_path / "tiny.yaml"
    preset.write_text(yaml.safe_dump(tiny_config("grpo", num_updates=1).model_dump(mode="json")))
    run_id = f"preempted-cli-{signum.name}"
    mark = tmp_path / "paused"
    env = {**os.environ, PAUSE_ENV: PAUSED_IN_OPTIMIZE, PAUSE_MARK_ENV: str(mark)}
    command = [sys.executable, "-m", "probepo.cli", "train", str(preset), "--run-id", run_id]
    child = subprocess.Popen(
        [*command, "--store", warm_store.url, "--quiet", "--tensorboard", str(tmp_path / "tb")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.kill(_wait_for_mark(mark, child), signum)
    _, err = child.communicate(timeout=120)
    assert child.returncode == PREEMPTED_EXIT, err
    assert f"probepo resume {run_id}" in err
    assert warm_store.committed(run_id, 0, "optimize.part-0000")
    assert not warm_store.committed(run_id, 0, "optimize")
    assert [a["outcome"] for a in warm_store.attempts(run_id, 0, "optimize")] == ["preempted"]


def test_cli_rejects_a_bad_preset_naming_the_field(tmp_path: Path):
    preset = tmp_path / "bad.yaml"
    preset.write_text(yaml.safe_dump({"algo": {"kappa": -1}}))
    result = _cli("train", str(preset), "--run-id", "x", "--store", str(tmp_path / "store"))
    assert result.returncode == 2
    assert "algo.kappa" in result.stderr and "greater than or equal to 0" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_resume_of_an_unknown_run_names_run_and_store(tmp_path: Path):
    result = _cli("resume", "no-such-run", "--store", str(tmp_path))
    assert result.returncode == 2
    assert "no-such-run" in result.stderr and str(tmp_path) in result.stderr


def test_training_from_a_worker_thread_runs_without_signal_handlers(warm_store: ArtifactStore):
    """Prefect runs tasks in threads, where Python forbids installing signal handlers."""
    with ThreadPoolExecutor(1) as pool:
        metrics = pool.submit(
            train, tiny_config("grpo", num_updates=1), "threaded", store=warm_store
        ).result()
    assert [m["update"] for m in metrics] == [0, 1]


def test_lease_keeper_renews_past_the_ttl_and_reports_a_takeover(warm_store: ArtifactStore):
    lease = acquire_lease(warm_store, "kept", "driver-a", ttl_s=1.0)
    with LeaseKeeper(lease) as keeper:
        time.sleep(2.5)  # 2.5 TTLs: without renewal the lease would have expired
        with pytest.raises(LeaseHeld, match="driver-a"):
            acquire_lease(warm_store, "kept", "driver-b", ttl_s=60)
        keeper.check()
        acquire_lease(warm_store, "kept", "driver-b", ttl_s=60, force=True)  # an operator forces a takeover
        time.sleep(1.0)
        with pytest.raises(LeaseLost, match="kept"):
            keeper.check()


def test_resume_of_a_recipe_this_version_cannot_read_is_one_line_and_exit_2(warm_store, tmp_path):
    """A field renamed since the run was made: no traceback, the field named, and what to do."""
    config = tiny_config("grpo", num_updates=0)
    train(config, "renamed-field", store=warm_store)
    record = warm_store.read_run("renamed-field")
    record["config"]["algo"]["kapa"] = record["config"]["algo"].pop("kappa")
    warm_store.objects.put_bytes(RunLayout("renamed-field").run_json, to_json_bytes(record))
    result = _cli("resume", "renamed-field", "--store", warm_store.url)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith("error: ") and "algo.kapa" in first and "algo.kappa" in first
    assert "start a new run id" in result.stderr


@pytest.mark.parametrize(("shards", "sample_shards"), [(None, 4), (2, 2)])
def test_a_probe_preempted_between_shards_resumes_after_its_last_shard_bitwise(
    warm_store, monkeypatch, tmp_path, shards, sample_shards
):
    """Sample and probe commit each engine call as a shard (a chunk each, or with sampling.shards the
    chunks dealt into that many calls): a preempted probe stops after one and its next attempt decodes only
    the calls after it, ending bitwise where an uninterrupted run without shards ends (dealing chunks into
    calls changes no bit on CPU)."""
    whole = with_overrides(tiny_config("probepo", num_updates=1), **{"sampling.batch_rows": 6})
    if not warm_store.committed("sharded-whole", 1, "checkpoint"):
        train(whole, "sharded-whole", store=warm_store)
    run_id = f"sharded-{shards}"
    mark = tmp_path / "paused"
    monkeypatch.setenv(PAUSE_ENV, "0:probe.shard-0000:after-commit")
    monkeypatch.setenv(PAUSE_MARK_ENV, str(mark))
    sender = threading.Thread(target=lambda: os.kill(_wait_for_mark(mark), signal.SIGUSR2), daemon=True)
    sender.start()
    config = with_overrides(whole, **{"sampling.shards": shards})
    with pytest.raises(Preempted, match=r"during probe of update 0: 1 of \d+ shards committed"):
        train(config, run_id, store=warm_store)
    sender.join()
    monkeypatch.delenv(PAUSE_ENV)
    train(config, run_id, store=warm_store)
    made = [s for s in warm_store.committed_stages(run_id, 0) if s.startswith("sample.shard-")]
    assert len(made) == sample_shards
    attempts = warm_store.attempts(run_id, 0, "probe")
    assert [a["outcome"] for a in attempts] == ["preempted", "committed"]
    assert attempts[-1]["resumed_shards"] == 1 and attempts[-1]["shards_run"] >= 1
    for name in ("model.safetensors", "optimizer.safetensors"):
        assert (
            warm_store.read_stage(run_id, 1, "checkpoint")[name]
            == warm_store.read_stage("sharded-whole", 1, "checkpoint")[name]
        )


def test_a_recipe_made_before_a_field_existed_still_resumes(warm_store):
    """A field added since takes its default, which keeps what older code computed: same recipe."""
    config = tiny_config("grpo", num_updates=0)
    train(config, "older", store=warm_store)
    record = warm_store.read_run("older")
    del record["config"]["sampling"]["batch_rows"]
    warm_store.objects.put_bytes(RunLayout("older").run_json, to_json_bytes(record))
    train(config, "older", store=warm_store)  # no RunConfigMismatch
    with pytest.raises(RunConfigMismatch, match=r"config\.algo\.algorithm"):
        train(tiny_config("probepo", num_updates=0), "older", store=warm_store)
