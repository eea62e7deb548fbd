"""The recipe's `determinism` switch (docs/DETERMINISM.md): at its default it changes no run id and no store
made before it; `bitwise` sets the process up on CUDA (torch's deterministic algorithms, cuBLAS's fixed
workspace, vLLM's batch-invariant mode) and `fast` does not; under `fast` a replay that does not reproduce
its weights is recorded, not fatal and not a warning, and `store ls` says that such replays are checked but
not expected to match, as the attempt's record does (`replay_expected_to_match`). (The GPU itself:
bench/gpu_gate.py.)"""

from __future__ import annotations

import json
import logging
import os
import sys
import types
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from probepo.config import RunConfig
from probepo.presets import load_run_config, with_overrides
from probepo.run import determinism
from probepo.run.demo import arm_runs
from probepo.run.faults import STOP_ENV
from probepo.run.pipeline import freeze_recipe, run_record, train
from probepo.run.preemption import Preempted
from probepo.stages.replay import FINGERPRINT
from probepo.store import Ledger, RunConfigMismatch, open_store
from tests.pipeline.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[2]
RECORDED_IDS = {
    "configs/cpu-demo.yaml": {"grpo": "demo-grpo-s0-554d5a97", "probepo": "demo-probepo-s0-741287f9"},
    "configs/cpu-pointer.yaml": {"grpo": "demo-grpo-s0-022c1d6e", "probepo": "demo-probepo-s0-c9347839"},
}
"""The demo's run ids of two presets, as the code before `determinism` hashed their recipes."""


@pytest.mark.parametrize("preset", sorted(RECORDED_IDS))
def test_the_default_leaves_run_ids_as_they_were_and_fast_names_another_run(preset):
    config = load_run_config(ROOT / preset)
    assert {arm: run_id for arm, (run_id, _) in arm_runs(config).items()} == RECORDED_IDS[preset]
    fast = with_overrides(config, determinism="fast")
    assert not set(run_id for run_id, _ in arm_runs(fast).values()) & set(RECORDED_IDS[preset].values())
    assert "determinism" not in json.loads(config.recipe_json())
    assert json.loads(fast.recipe_json())["determinism"] == "fast"


def test_an_unknown_setting_is_refused_naming_the_field():
    with pytest.raises(ValidationError, match="determinism\n  Input should be 'bitwise' or 'fast'"):
        RunConfig(determinism="exact")


def test_run_json_records_it_and_a_store_made_before_it_resumes_as_bitwise(tmp_path):
    store, config = open_store(tmp_path / "store"), RunConfig()
    assert run_record(config)["config"]["determinism"] == "bitwise"
    older = run_record(config)
    del older["config"]["determinism"]
    store.create_run("older", older)
    freeze_recipe(store, "older", config)  # the field's default is what older code did
    with pytest.raises(RunConfigMismatch, match=r"differing: config\.determinism"):
        freeze_recipe(store, "older", with_overrides(config, determinism="fast"))
    assert "  determinism: bitwise (a replay must reproduce the weights it committed)" in (
        Ledger(store, "older").summary()
    )


@pytest.fixture
def on_cuda(monkeypatch):
    """As if torch saw a GPU; torch's deterministic flag and cuBLAS's variable restored afterwards."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv(determinism.CUBLAS_WORKSPACE_ENV, raising=False)
    monkeypatch.delenv(determinism.VLLM_BATCH_INVARIANT_ENV, raising=False)
    yield
    torch.use_deterministic_algorithms(False)


def test_bitwise_on_cuda_turns_deterministic_kernels_on_and_fast_turns_them_off(on_cuda, monkeypatch):
    determinism.apply_determinism(RunConfig())
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()
    assert os.environ[determinism.CUBLAS_WORKSPACE_ENV] == ":4096:8"
    determinism.apply_determinism(RunConfig(determinism="fast"))
    assert not torch.are_deterministic_algorithms_enabled()
    monkeypatch.setenv(determinism.CUBLAS_WORKSPACE_ENV, ":16:8")  # vLLM's choice on Hopper: also fixed
    determinism.apply_determinism(RunConfig())
    assert os.environ[determinism.CUBLAS_WORKSPACE_ENV] == ":16:8"


def test_nothing_is_set_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv(determinism.CUBLAS_WORKSPACE_ENV, raising=False)
    determinism.apply_determinism(RunConfig())
    assert not torch.are_deterministic_algorithms_enabled()
    assert determinism.CUBLAS_WORKSPACE_ENV not in os.environ


def test_bitwise_with_vllm_installs_its_batch_invariant_mode_once_before_any_engine(on_cuda, monkeypatch):
    seen = []
    module = types.ModuleType("vllm.model_executor.determinism.batch_invariant")
    module.init_batch_invariance = lambda: seen.append(os.environ.get(determinism.VLLM_BATCH_INVARIANT_ENV))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    determinism._vllm_batch_invariant.cache_clear()
    model = {"kind": "hf", "pretrained": "policy", "generator": "vllm"}
    config = RunConfig.model_validate({"task": {"kind": "math"}, "model": model})
    try:
        determinism.apply_determinism(config)
        determinism.apply_determinism(config)
        determinism.apply_determinism(with_overrides(config, determinism="fast"))
    finally:
        determinism._vllm_batch_invariant.cache_clear()
    assert seen == ["1"]  # the variable set before vLLM reads it, the kernels installed once


@pytest.mark.parametrize("setting", ["bitwise", "fast"])
def test_a_replay_that_does_not_match_is_recorded_with_whether_it_was_expected_to(
    setting, warm_store, monkeypatch, caplog
):
    """Under `fast` it is logged, not warned of, and `store ls` says it was not expected; under `bitwise` it
    is warned of. Either way the attempt records `replay_expected_to_match`, the run record's word."""
    run_id = f"{setting}-diverged"
    config = tiny_config(num_updates=3, checkpoint_every=3, determinism=setting)  # policies 1, 2 in memory
    monkeypatch.setenv(STOP_ENV, "2:score:before-commit")  # USR2 there: the driver stops after the commit
    with pytest.raises(Preempted):
        train(config, run_id, store=warm_store)
    monkeypatch.delenv(STOP_ENV)
    marker = Path(warm_store.url) / "runs" / run_id / "ledger" / "000001" / "optimize.json"
    record = json.loads(marker.read_text())
    record["summary"][FINGERPRINT] = "0" * 16  # as if update 1 had been computed by other kernels
    marker.write_text(json.dumps(record))
    with caplog.at_level(logging.INFO, logger="probepo.stages.replay"):
        train(config, run_id, store=warm_store)  # a fresh runner: policy 2 is rebuilt by replay
    [replay] = [a for a in warm_store.attempts(run_id) if a.get("replayed_updates")]  # read back from JSON
    assert replay["replayed_updates"] == 2 and replay["replay_diverged"] == [1]
    assert replay["replay_expected_to_match"] is (setting == "bitwise")
    warned = [r for r in caplog.records if r.name == "probepo.stages.replay" and r.levelno >= logging.WARNING]
    summary = Ledger(warm_store, run_id).summary()
    if setting == "fast":
        assert "as `determinism: fast` allows" in caplog.text and not warned
        assert "  determinism: fast (replays are checked but not expected to match)" in summary
    else:
        assert [r.getMessage() for r in warned] == [
            f"run {run_id}: replaying optimize of updates [1] did not reproduce the weights they committed"
            " (another device, dtype or thread count than the run, e.g. OMP_NUM_THREADS); the run goes on,"
            " no longer bitwise equal to an uninterrupted one"
        ]
        assert "  determinism: bitwise (a replay must reproduce the weights it committed)" in summary
    assert (
        "  replays: 2 optimize stage(s) replayed and checked, updates 1 did not (replay_diverged)" in summary
    )
    assert "status: complete" in summary
