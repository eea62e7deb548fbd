"""The driver's guards: one driver per run, preemption at a safe point, clear errors on bad input."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from probepo.pipeline import LeaseKeeper, train
from probepo.preemption import Preempted, StopFlag
from probepo.store import ArtifactStore, LeaseHeld, LeaseLost, RunConfigMismatch, acquire_lease
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


def test_preemption_commits_the_minibatch_then_stops(warm_store: ArtifactStore, monkeypatch):
    monkeypatch.setattr(StopFlag, "__call__", lambda self: True)  # as if SIGUSR2 had arrived
    config = tiny_config("grpo", num_updates=1)
    with pytest.raises(Preempted, match="mini-batch 0 of update 0"):
        train(config, "preempted", store=warm_store)
    assert warm_store.committed("preempted", 0, "optimize.part-0000")
    assert not warm_store.committed("preempted", 0, "optimize")
    monkeypatch.undo()
    train(config, "preempted", store=warm_store)
    assert warm_store.committed("preempted", 0, "optimize")
    outcomes = [a["outcome"] for a in warm_store.attempts("preempted", 0, "optimize")]
    assert outcomes == ["preempted", "committed"]


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
