"""The tiny Qwen2 recipe with vLLM generating: two ProbePO updates through every stage, and a run killed
before update 1's sample that resumes in a fresh process — whose new vLLM engine must sample with policy 1
(checkpoint 1), as the uninterrupted run's resident engine did after its in-place weight sync. Equal
rollouts at update 1 show neither ran stale weights (policy 0 would sample other tokens)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import yaml

from probepo.run.faults import CRASH_ENV
from probepo.run.pipeline import train
from probepo.store import open_store
from tests.hf.tiny_qwen import qwen_config

pytest.importorskip("vllm", reason="vLLM tier: run `bash scripts/test-vllm.sh`")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

FILES = ("model.safetensors", "optimizer.safetensors", "trainer.json")


def vllm_config(tiny_qwen):
    model = {"kind": "hf", "pretrained": str(tiny_qwen.folder), "generator": "vllm", "vllm_memory": 0.3}
    return qwen_config(tiny_qwen.folder, model=model, eval={"problems": 4, "every": 2, "greedy": False})


def test_a_resumed_run_samples_with_the_checkpoint_it_resumes_from(tiny_qwen, tmp_path):
    store = open_store(tmp_path / "store")
    config = vllm_config(tiny_qwen)
    train(config, "vllm", store=store)

    preset = tmp_path / "qwen-vllm.yaml"
    preset.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    command = [sys.executable, "-m", "probepo.cli", "train", str(preset), "--run-id", "vllm-killed"]
    command += ["--store", store.url, "--quiet", "--tensorboard", str(tmp_path / "tb")]
    command += ["--executor", "inline"]  # an hf recipe's default where sbatch is on PATH is resident
    env = {**os.environ, CRASH_ENV: "1:sample:before-commit"}
    killed = subprocess.run(command, env=env, capture_output=True, timeout=900)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert store.committed("vllm-killed", 1, "checkpoint") and not store.committed("vllm-killed", 1, "sample")
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    for update in (0, 1):
        ours = store.read_stage("vllm-killed", update, "sample")["rollouts.parquet"]
        assert ours == store.read_stage("vllm", update, "sample")["rollouts.parquet"], f"update {update}"
    assert (
        store.read_stage("vllm", 1, "sample")["rollouts.parquet"]
        != store.read_stage("vllm", 0, "sample")["rollouts.parquet"]
    )
    again, first = store.read_stage("vllm-killed", 2, "checkpoint"), store.read_stage("vllm", 2, "checkpoint")
    assert {name: again[name] for name in FILES} == {name: first[name] for name in FILES}
